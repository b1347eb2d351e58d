"""What every tokeniser provides."""
from __future__ import annotations


class Tokenizer:
    """Turns a raw line into space-separated tokens; ``lowercase`` applies before tokenising."""

    name = "base"

    def __init__(self, lowercase: bool = False):
        self.lowercase = lowercase

    def tokenize(self, line: str) -> str:
        raise NotImplementedError

    def __call__(self, line: str) -> str:
        return self.tokenize(line.lower() if self.lowercase else line)

    def corpus(self, lines: list[str]) -> list[str]:
        return [self(line) for line in lines]

    @property
    def settings(self) -> dict:
        """What a score computed on these tokens depends on (goes into its signature)."""
        return {"tok": self.name, "lc": "yes" if self.lowercase else "no"}

    @property
    def signature(self) -> str:
        return "|".join(f"{k}:{v}" for k, v in self.settings.items())
