"""Fuzzy reordering score (Talbot et al. 2011), from a source-to-target word alignment.

The source words are put in target order; the sentence then falls into C chunks, maximal runs of source
words that stay adjacent and in order. With M words, FRS = 1 - (C - 1) / (M - 1): 1 for a monotone
alignment, 0 when no two neighbours stay together. Conventions (see docs/analysis.md):

* unaligned source words are left out (they carry no target position), so M counts aligned source words;
* a source word linked to several target words sits at its leftmost target position;
* source words sharing that position (many-to-one) keep their source order;
* sentences with M < 2 have no neighbours to keep: they are skipped, and counted in ``skipped``.

The corpus score is the mean of the sentence scores.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from nat_kd.analysis.formats import Alignments
from nat_kd.analysis.metrics.base import (CARD, CENTRAL, CORRELATION, DECODING, RANKING, REPORT, AlignedCorpus, Column,
                                          Measure, MeasuredSet, Signature)

# the conventions above, in every signature of an FRS
CONVENTIONS = "drop-unaligned,leftmost-target"


def sentence_scores(alignments: Alignments) -> np.ndarray:
    """FRS of every sentence; NaN where fewer than two source words are aligned."""
    sent, src, tgt = alignments.sentence, alignments.source, alignments.target
    n = alignments.num_sentences
    if len(sent) == 0:
        return np.full(n, np.nan)
    # one entry per aligned source word: its leftmost target position
    by_word = np.lexsort((tgt, src, sent))
    sent, src, tgt = sent[by_word], src[by_word], tgt[by_word]
    first = np.concatenate(([True], (sent[1:] != sent[:-1]) | (src[1:] != src[:-1])))
    w_sent, w_src, w_tgt = sent[first], src[first], tgt[first]
    # rank of each aligned word among its sentence's aligned words, in source order
    w_start = np.searchsorted(w_sent, w_sent, side="left")
    rank = np.arange(len(w_sent)) - w_start
    # the permutation: words in target order (ties in source order)
    perm = np.lexsort((w_src, w_tgt, w_sent))
    p_sent, p_rank = w_sent[perm], rank[perm]
    same_sentence = p_sent[1:] == p_sent[:-1]
    breaks = same_sentence & (p_rank[1:] != p_rank[:-1] + 1)
    chunks = 1 + np.bincount(p_sent[1:][breaks], minlength=n)
    words = np.bincount(w_sent, minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(words >= 2, 1.0 - (chunks - 1) / (words - 1), np.nan)


@dataclass
class ReorderingScore:
    score: float
    sentences: np.ndarray  # per-sentence FRS, NaN for skipped ones
    skipped: int
    signature: Signature

    def format(self) -> str:
        return (f"FRS = {self.score:.4f} over {len(self.sentences) - self.skipped} sentences "
                f"({self.skipped} with < 2 aligned source words skipped) | {self.signature}")


class Reordering:
    """Fuzzy reordering score of a corpus alignment."""

    def corpus_score(self, alignments: Alignments | Iterable[Alignments],
                     settings: dict | None = None) -> ReorderingScore:
        """FRS of a corpus alignment, given whole or as shards in corpus order (``alignment_shards``)."""
        shards = [alignments] if isinstance(alignments, Alignments) else alignments
        scores = np.concatenate([sentence_scores(shard) for shard in shards])
        valid = ~np.isnan(scores)
        mean = float(scores[valid].mean()) if valid.any() else float("nan")
        signature = Signature("reordering", {**(settings or {}), "frs": CONVENTIONS})
        return ReorderingScore(mean, scores, int((~valid).sum()), signature)


def line_scores(aligned: AlignedCorpus, scores: np.ndarray | None = None) -> np.ndarray:
    """FRS of every input line of an aligned corpus, NaN on the lines it dropped as empty (``--drop-empty``)
    and on lines with fewer than two aligned source words. ``scores``: the kept lines' FRS, if computed."""
    if scores is None:
        scores = Reordering().corpus_score(aligned.result.alignment_shards()).sentences
    out = np.full(aligned.pairs + aligned.dropped_empty, np.nan)
    kept = np.ones(len(out), dtype=bool)
    kept[np.asarray(aligned.dropped_lines, dtype=np.int64) - 1] = False
    out[kept] = scores
    return out


def reordering_score(data: MeasuredSet) -> ReorderingScore:
    """The set's FRS with every kept line's, for the corpus and the per-line scores."""
    return Reordering().corpus_score(data.aligned.result.alignment_shards())


class FuzzyReordering(Measure):
    """The fuzzy reordering score of the set's alignment: how monotone its targets follow their sources."""

    name, label, format, line_column = "reordering", "FRS", ".4f", "frs"
    tables = {REPORT: Column(), CARD: Column(), RANKING: Column(format=".3f"), CENTRAL: Column(format=".3f"),
              DECODING: Column(), CORRELATION: Column()}

    def corpus_score(self, data: MeasuredSet) -> float:
        return data.once(reordering_score).score

    def line_scores(self, data: MeasuredSet) -> np.ndarray:
        return line_scores(data.aligned, data.once(reordering_score).sentences)

    def signature_settings(self) -> dict:
        return {"frs": CONVENTIONS}
