"""Tokenisers for the analysis: sacrebleu's 13a, none (text is already tokenised), or a sentencepiece model.

Each is a callable ``str -> str`` (tokens joined by single spaces) with a ``signature`` naming its settings.
"""
from __future__ import annotations


from nat_kd.analysis.tokenizers.base import Tokenizer
from nat_kd.analysis.tokenizers.none import NoneTokenizer
from nat_kd.analysis.tokenizers.sentencepiece import SentencePieceTokenizer
from nat_kd.analysis.tokenizers.thirteen_a import Tokenizer13a
from nat_kd.errors import SettingsError

TOKENIZERS = ("13a", "none", "spm")


def get_tokenizer(name: str | None, lowercase: bool = False, spm_model: str | None = None) -> Tokenizer:
    """Build a tokeniser by name: ``13a`` (also for None: none asked for), ``none`` (pre-tokenised text) or
    ``spm`` (needs ``spm_model``, which the others would ignore: it is an error with them)."""
    name = name or "13a"
    if spm_model and name != "spm":
        raise SettingsError(f"--spm-model is read only by --tok spm, not --tok {name}: add --tok spm to tokenise "
                            "with the model, or drop --spm-model")
    if name == "13a":
        return Tokenizer13a(lowercase)
    if name == "none":
        return NoneTokenizer(lowercase)
    if name == "spm":
        if not spm_model:
            raise SettingsError("the 'spm' tokeniser needs a sentencepiece model: pass --spm-model FILE.model")
        return SentencePieceTokenizer(spm_model, lowercase)
    raise SettingsError(f"unknown tokeniser {name!r}; choose one of {', '.join(TOKENIZERS)}")


__all__ = ["Tokenizer", "Tokenizer13a", "NoneTokenizer", "SentencePieceTokenizer", "get_tokenizer", "TOKENIZERS"]
