"""No tokenisation: the text is already tokenised; only whitespace is normalised."""
from __future__ import annotations

from nat_kd.analysis.tokenizers.base import Tokenizer


class NoneTokenizer(Tokenizer):
    name = "none"

    def tokenize(self, line: str) -> str:
        return " ".join(line.split())
