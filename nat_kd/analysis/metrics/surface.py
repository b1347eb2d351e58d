"""Surface statistics of a tokenised corpus side: word types and tokens, and the share of sentences in which
some n-gram occurs twice (a teacher that loops writes "a man a man ..."; a fluent caption rarely repeats a
bigram).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nat_kd.analysis.metrics.base import DETAILS, Measure, MeasuredSet, pairs_in_memory
from nat_kd.errors import SettingsError


@dataclass
class SurfaceStats:
    types: int
    tokens: int
    repeated: dict[int, float]  # n -> share of sentences with a repeated n-gram

    def as_dict(self) -> dict:
        return {"types": self.types, "tokens": self.tokens,
                "repeated_ngram_share": {str(n): share for n, share in self.repeated.items()}}


def _token_ids(lines: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(word id of every token, its sentence, vocabulary size) of tokenised lines."""
    tokens = [line.split() for line in lines]
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    vocabulary, ids = np.unique(np.array([w for t in tokens for w in t], dtype=object), return_inverse=True)
    return ids.astype(np.int64), np.repeat(np.arange(len(tokens)), lengths), len(vocabulary)


def surface_stats(lines: list[str], ns: list[int]) -> SurfaceStats:
    """``lines``: tokenised sentences (tokens separated by spaces)."""
    ids, sentence, vocab = _token_ids(lines)
    shares = {}
    for n in ns:
        counts = _repeated_counts(ids, sentence, vocab, n, len(lines))
        shares[n] = float((counts > 0).mean()) if len(lines) else float("nan")
    return SurfaceStats(vocab, len(ids), shares)


def repeated_ngram_counts(lines: list[str], n: int) -> np.ndarray:
    """Per tokenised line, the n-gram positions whose n-gram already starts at an earlier position of the
    same line (occurrences minus distinct n-grams): 0 for a line without repetition."""
    ids, sentence, vocab = _token_ids(lines)
    return _repeated_counts(ids, sentence, vocab, n, len(lines))


def _repeated_counts(ids: np.ndarray, sentence: np.ndarray, vocab: int, n: int, sentences: int) -> np.ndarray:
    """Per sentence, the n-gram positions that repeat an n-gram of the same sentence."""
    if n < 1:
        raise SettingsError(f"n-gram order must be >= 1, not {n}")
    if vocab ** n >= 2 ** 63:
        raise SettingsError(f"{n}-grams over {vocab} types do not fit one 64-bit code")
    starts = np.arange(len(ids) - n + 1)
    if not sentences or not len(starts):
        return np.zeros(sentences, dtype=np.int64)
    inside = sentence[starts] == sentence[starts + n - 1]  # the n-gram does not cross a sentence boundary
    starts = starts[inside]
    code = np.zeros(len(starts), dtype=np.int64)
    for k in range(n):
        code = code * vocab + ids[starts + k]
    order = np.lexsort((code, sentence[starts]))
    same = (np.diff(code[order]) == 0) & (np.diff(sentence[starts][order]) == 0)
    return np.bincount(sentence[starts][order][1:][same], minlength=sentences)


def target_surface(data: MeasuredSet) -> SurfaceStats:
    """The surface of the set's targets, tokenised as the aligner saw them."""
    return surface_stats([" ".join(tgt) for _, tgt in data.once(pairs_in_memory)], list(data.settings.repeat_n))


class TargetTypes(Measure):
    name, label, needs = "types", "target types", DETAILS

    def corpus_score(self, data: MeasuredSet) -> int:
        return data.once(target_surface).types


class TargetTokens(Measure):
    name, label, needs = "tokens", "target tokens", DETAILS

    def corpus_score(self, data: MeasuredSet) -> int:
        return data.once(target_surface).tokens


class RepeatedNgramShare(Measure):
    """For each n of the detailed report's, the share of the set's targets in which some n-gram occurs twice."""

    name, label, needs = "repeated_ngram_share", "share with a repeated n-gram", DETAILS

    def corpus_score(self, data: MeasuredSet) -> dict[str, float]:
        return data.once(target_surface).as_dict()["repeated_ngram_share"]
