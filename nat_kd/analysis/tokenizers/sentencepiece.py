"""Subword pieces from a trained sentencepiece model (pieces as tokens, e.g. '▁the')."""
from __future__ import annotations

from pathlib import Path

from nat_kd.corpus import CorpusError
from nat_kd.analysis.tokenizers.base import Tokenizer


class SentencePieceTokenizer(Tokenizer):
    name = "spm"

    def __init__(self, model_path: str, lowercase: bool = False):
        super().__init__(lowercase)
        if not Path(model_path).is_file():
            raise CorpusError(f"{model_path}: no such sentencepiece model; pass the .model file written by "
                              "spm_train")
        import sentencepiece

        self.model_path = str(model_path)
        self._processor = sentencepiece.SentencePieceProcessor(model_file=self.model_path)

    def tokenize(self, line: str) -> str:
        return " ".join(self._processor.encode(line, out_type=str))

    @property
    def settings(self) -> dict:
        return {"tok": f"spm({Path(self.model_path).name})", "lc": "yes" if self.lowercase else "no"}
