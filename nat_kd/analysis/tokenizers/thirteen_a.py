"""sacrebleu's 13a tokeniser (the mteval-v13a rules BLEU uses), called, never re-implemented."""
from __future__ import annotations

from nat_kd.analysis.tokenizers.base import Tokenizer


class Tokenizer13a(Tokenizer):
    name = "13a"

    def __init__(self, lowercase: bool = False):
        super().__init__(lowercase)
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a as SacreTokenizer13a

        self._tokenize = SacreTokenizer13a()

    def tokenize(self, line: str) -> str:
        return " ".join(self._tokenize(line).split())
