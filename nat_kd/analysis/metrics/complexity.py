"""Corpus complexity C(d) = (1/|Vx|) sum_x H(y|x) (Zhou, Gu & Neubig, ICLR 2020).

H(y|x) is the entropy of source word x's translation distribution in a fast_align table, each row first
renormalised (pruned rows and variational-Bayes rows do not sum to one). The NULL row is left out.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nat_kd.analysis.formats import TranslationTable
from nat_kd.analysis.metrics.base import (CARD, CENTRAL, CORRELATION, DECODING, RANKING, REPORT, AlignedCorpus, Column,
                                          Measure, MeasuredSet, Signature, log_base_divisor, unit_name)


def row_entropies(table: TranslationTable) -> tuple[np.ndarray, np.ndarray]:
    """(row ids present, entropy in nats of each), NULL excluded, rows renormalised."""
    table = table.without_null().normalised()
    plogp = table.prob * np.log(table.prob)
    entropy = -np.bincount(table.row, plogp, minlength=len(table.rows))
    present = table.present_rows()
    return present, np.maximum(entropy[present], 0.0)  # -0.0 and rounding dust on one-entry rows


@dataclass
class ComplexityScore:
    score: float
    vocab_size: int
    words: list[str]           # every source word, sorted from most to least uncertain
    entropies: np.ndarray      # their entropies, same order, in the score's unit
    signature: Signature

    @property
    def unit(self) -> str:
        return unit_name(self.signature.settings.get("log", "e"))

    def most_uncertain(self, k: int = 10) -> list[tuple[str, float]]:
        return list(zip(self.words[:k], self.entropies[:k].tolist()))

    def least_uncertain(self, k: int = 10) -> list[tuple[str, float]]:
        return list(zip(self.words[::-1][:k], self.entropies[::-1][:k].tolist()))

    def format(self) -> str:
        return f"C(d) = {self.score:.4f} {self.unit} over |Vx| = {self.vocab_size} | {self.signature}"

    def _counts(self, counts: dict[str, int]) -> np.ndarray:
        return np.array([counts.get(w, 0) for w in self.words], dtype=np.int64)

    def token_weighted(self, counts: dict[str, int]) -> float:
        """The mean entropy over source *tokens* instead of types: each word weighted by its count in
        ``counts`` (the real data's source side). On a small corpus the paper's mean over types is mostly
        rare words; this one is what a model meets in running text."""
        weights = self._counts(counts)
        return float(weights @ self.entropies / weights.sum()) if weights.sum() else float("nan")

    def by_frequency(self, counts: dict[str, int], edges: list[int]) -> list[dict]:
        """C(d) within buckets of source words by their count in ``counts``: bucket i holds the words with
        edges[i] <= count < edges[i+1] (the last is open). Each: label, words (types in the table), C(d)."""
        bucket = np.searchsorted(np.asarray(edges), self._counts(counts), side="right") - 1
        out = []
        for i, low in enumerate(edges):
            high = edges[i + 1] - 1 if i + 1 < len(edges) else None
            label = f"{low}+" if high is None else (str(low) if high == low else f"{low}-{high}")
            chosen = self.entropies[bucket == i]
            out.append({"bucket": label, "words": int(len(chosen)),
                        "complexity": float(chosen.mean()) if len(chosen) else float("nan")})
        return out


class Complexity:
    """C(d) of a translation table; ``log_base`` 'e' (nats, default) or '2' (bits)."""

    def __init__(self, log_base: str = "e"):
        self.log_base = log_base
        self.divisor = log_base_divisor(log_base)

    def table_score(self, table: TranslationTable, settings: dict | None = None) -> ComplexityScore:
        present, entropy = row_entropies(table)
        entropy = entropy / self.divisor
        order = np.argsort(-entropy, kind="stable")
        words = [table.rows[r] for r in present[order]]
        return ComplexityScore(float(entropy.mean()) if len(entropy) else float("nan"), len(present), words,
                               entropy[order], Signature("complexity", {**(settings or {}), "log": self.log_base}))

    def corpus_score(self, aligned: AlignedCorpus) -> ComplexityScore:
        """C(d) of an aligned corpus (see ``nat_kd.analysis.metrics.align_corpus``), from its exported table."""
        return self.table_score(aligned.result.exported_table(), aligned.settings)


def complexity_score(data: MeasuredSet) -> ComplexityScore:
    """The set's C(d) with every word's entropy, for the measures that read it."""
    return Complexity(data.settings.log_base).table_score(data.table)


class TypeComplexity(Measure):
    """C(d) as the paper defines it: the mean entropy over source word types."""

    name, label, format = "complexity", "C(d)", ".4f"
    tables = {REPORT: Column(), CARD: Column(), RANKING: Column("C(d) paper", ".3f"),
              CENTRAL: Column("C(d) paper", ".3f"), DECODING: Column("complexity C(d)"),
              CORRELATION: Column("C(d), paper (mean over types)")}

    def corpus_score(self, data: MeasuredSet) -> float:
        return data.once(complexity_score).score

    def signature_settings(self) -> dict:
        return {"log": self.settings.log_base}
