"""Fuzzy reordering score (Talbot et al. 2011), from a source-to-target word alignment.

The source words are put in target order; the sentence then falls into C chunks, maximal runs of source
words that stay adjacent and in order. Two conventions (``CONVENTION_RULES``; docs/analysis.md sets them beside
the public implementations):

``chunks`` (the default): with M words, FRS = 1 - (C - 1) / (M - 1): 1 for a monotone alignment, 0 when no
two neighbours stay together.

* unaligned source words are left out (they carry no target position), so M counts aligned source words;
* a source word linked to several target words sits at its leftmost target position;
* source words sharing that position (many-to-one) keep their source order;
* sentences with M < 2 have no neighbours to keep: they are skipped, and counted in ``skipped``.

``boundary`` (google/topdown-btg-preordering's ``evaluate_preordering.py``): a start and an end marker are added
around the source, and FRS = 1 - D / (M + 1), D the discontinuities among the M + 1 neighbour pairs, markers
included.

* unaligned source words are left out, as above;
* each source word is ranked by its target span (leftmost, rightmost); a sentence where one word's span holds
  another's strictly inside it has no such order: it is skipped, and counted in ``skipped``;
* words with the same span share a rank, and neighbours of one rank count as continuous;
* sentences with M < 2 score 1.

The corpus score is the mean of the sentence scores.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from nat_kd.analysis.formats import Alignments
from nat_kd.analysis.metrics.base import (CARD, CENTRAL, CORRELATION, DECODING, RANKING, REPORT, AlignedCorpus, Column,
                                          Measure, MeasuredSet, Signature)
from nat_kd.errors import SettingsError

# each convention's rules as its signatures state them: normalisation, unaligned words, position, ties, short
# and skipped sentences
CONVENTION_RULES = {
    "chunks": "1-(C-1)/(M-1),drop-unaligned,leftmost-target,ties-in-source-order,M<2-skipped",
    "boundary": "1-D/(M+1),boundary-markers,drop-unaligned,target-span,ties-continuous,nested-spans-skipped,"
                "M<2-scores-1",
}
# the default convention's, in every signature of the report's FRS
CONVENTIONS = CONVENTION_RULES["chunks"]
SKIPPED = {"chunks": "with < 2 aligned source words", "boundary": "with nested target spans"}


def _aligned_words(alignments: Alignments) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One entry per aligned source word, in (sentence, source) order: its sentence, source index, leftmost and
    rightmost target position."""
    order = np.lexsort((alignments.target, alignments.source, alignments.sentence))
    sent, src, tgt = alignments.sentence[order], alignments.source[order], alignments.target[order]
    first = np.concatenate(([True], (sent[1:] != sent[:-1]) | (src[1:] != src[:-1])))
    last = np.concatenate((first[1:], [True]))
    return sent[first], src[first], tgt[first], tgt[last]


def sentence_scores(alignments: Alignments) -> np.ndarray:
    """FRS of every sentence (the ``chunks`` convention); NaN where fewer than two source words are aligned."""
    n = alignments.num_sentences
    if len(alignments.sentence) == 0:
        return np.full(n, np.nan)
    w_sent, w_src, w_tgt, _ = _aligned_words(alignments)
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


def boundary_sentence_scores(alignments: Alignments) -> np.ndarray:
    """FRS of every sentence in the ``boundary`` convention; NaN where target spans nest."""
    n = alignments.num_sentences
    if len(alignments.sentence) == 0:
        return np.ones(n)
    w_sent, _, w_left, w_right = _aligned_words(alignments)
    words = np.bincount(w_sent, minlength=n)
    # the words by span; spans nest exactly where, in this order, the rightmost position falls
    by_span = np.lexsort((w_right, w_left, w_sent))
    s_sent, s_left, s_right = w_sent[by_span], w_left[by_span], w_right[by_span]
    same = s_sent[1:] == s_sent[:-1]
    nested = np.bincount(s_sent[1:][same & (s_right[1:] < s_right[:-1])], minlength=n) > 0
    # each word's rank: the number of distinct spans before its own in its sentence
    new_span = np.concatenate(([True], ~same | (s_left[1:] != s_left[:-1]) | (s_right[1:] != s_right[:-1])))
    classes = np.cumsum(new_span) - 1
    sorted_rank = classes - classes[np.searchsorted(s_sent, s_sent, side="left")]
    rank = np.empty_like(sorted_rank)
    rank[by_span] = sorted_rank
    # continuous neighbours in source order: the same rank or the next; the start marker precedes rank 0, the
    # end marker follows the sentence's highest rank
    step = rank[1:] - rank[:-1]
    inner = (w_sent[1:] == w_sent[:-1]) & ((step == 0) | (step == 1))
    starts = np.flatnonzero(np.concatenate(([True], w_sent[1:] != w_sent[:-1])))
    ends = np.concatenate((starts[1:], [len(w_sent)])) - 1
    highest = np.maximum.reduceat(rank, starts)
    continuous = np.bincount(w_sent[1:][inner], minlength=n)
    continuous[w_sent[starts]] += (rank[starts] == 0).astype(np.int64) + (rank[ends] == highest)
    scores = np.where(words >= 2, continuous / (words + 1), 1.0)
    return np.where(nested, np.nan, scores)


SENTENCE_SCORES = {"chunks": sentence_scores, "boundary": boundary_sentence_scores}


@dataclass
class ReorderingScore:
    score: float
    sentences: np.ndarray  # per-sentence FRS, NaN for skipped ones
    skipped: int
    signature: Signature
    convention: str = "chunks"

    def format(self) -> str:
        return (f"FRS = {self.score:.4f} over {len(self.sentences) - self.skipped} sentences "
                f"({self.skipped} {SKIPPED[self.convention]} skipped) | {self.signature}")


class Reordering:
    """Fuzzy reordering score of a corpus alignment, in one of the ``CONVENTION_RULES``."""

    def __init__(self, convention: str = "chunks"):
        if convention not in CONVENTION_RULES:
            raise SettingsError(f"unknown FRS convention {convention!r}; choose one of {', '.join(CONVENTION_RULES)}")
        self.convention = convention

    def corpus_score(self, alignments: Alignments | Iterable[Alignments],
                     settings: dict | None = None) -> ReorderingScore:
        """FRS of a corpus alignment, given whole or as shards in corpus order (``alignment_shards``)."""
        shards = [alignments] if isinstance(alignments, Alignments) else alignments
        scores = np.concatenate([SENTENCE_SCORES[self.convention](shard) for shard in shards])
        valid = ~np.isnan(scores)
        mean = float(scores[valid].mean()) if valid.any() else float("nan")
        signature = Signature("reordering", {**(settings or {}), "frs": CONVENTION_RULES[self.convention]})
        return ReorderingScore(mean, scores, int((~valid).sum()), signature, self.convention)


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
