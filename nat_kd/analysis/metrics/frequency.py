"""Does distillation erase rare words? Source words bucketed by their count in the real data, and for each
bucket: C(d) (``ComplexityScore.by_frequency``), the share of the word pairs linked in the real data that the
distilled data still links, and the source words that lose every translation they had.

A word pair (x, y) is *linked* in a corpus when the aligner's Viterbi links join source word x to target
word y in at least one sentence (types, not tokens: a pair linked 40 times counts once). Of the real data's
pairs whose x falls in a bucket, ``kept`` is the share that the distilled data links too; a source word
*loses every translation* when it has linked pairs in the real data and none of them is linked in the
distilled data (whether the distilled data links it to other words, or to none).

Its measures: the bucket table, the words losing every translation summed over it, and C(d) within the buckets
and weighted by the real data's source-token counts.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from nat_kd.analysis.formats import Alignments
from nat_kd.analysis.metrics.base import (CARD, CENTRAL, CORRELATION, DETAILS, RANKING, REPORT, Column, Measure,
                                          MeasuredSet)
from nat_kd.analysis.metrics.complexity import complexity_score

DEFAULT_BUCKETS = (1, 2, 5, 20)  # lower edges: 1, 2-4, 5-19, 20+


class Vocabulary:
    """Word <-> id, grown as words come; shared by the sets compared so their pair keys agree."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def encode(self, words: list[str]) -> np.ndarray:
        ids = self.ids
        return np.fromiter((ids.setdefault(w, len(ids)) for w in words), dtype=np.int64, count=len(words))


def linked_pairs(pairs: Iterable[tuple[list[str], list[str]]], shards: Iterable[Alignments],
                 source_vocab: Vocabulary, target_vocab: Vocabulary) -> np.ndarray:
    """The distinct linked (source id, target id) pairs of a corpus, as sorted int64 keys source << 32 | target.

    ``pairs``: the tokenised sentence pairs the aligner saw, in order; ``shards``: its links, shard by shard
    (``AlignmentResult.alignment_shards``), each numbering sentences from its own first."""
    keys, pairs = [], iter(pairs)
    for shard in shards:
        block = [next(pairs) for _ in range(shard.num_sentences)]
        src_len = np.array([len(s) for s, _ in block], dtype=np.int64)
        tgt_len = np.array([len(t) for _, t in block], dtype=np.int64)
        src_ids = source_vocab.encode([w for s, _ in block for w in s])
        tgt_ids = target_vocab.encode([w for _, t in block for w in t])
        src_start = np.concatenate(([0], np.cumsum(src_len)[:-1]))
        tgt_start = np.concatenate(([0], np.cumsum(tgt_len)[:-1]))
        x = src_ids[src_start[shard.sentence] + shard.source]
        y = tgt_ids[tgt_start[shard.sentence] + shard.target]
        keys.append(np.unique((x << 32) | y))
    return np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.int64)


@dataclass
class BucketRow:
    bucket: str
    words: int  # source types of the real data in the bucket
    complexity: float  # C(d) of the set over the bucket's words present in its table
    real_pairs: int  # distinct (x, y) linked in the real data, x in the bucket
    kept: float  # share of those the set links too
    words_losing_all: int  # bucket words with linked real pairs, none linked in the set

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def bucket_labels(edges: list[int]) -> list[str]:
    labels = []
    for i, low in enumerate(edges):
        high = edges[i + 1] - 1 if i + 1 < len(edges) else None
        labels.append(f"{low}+" if high is None else (str(low) if high == low else f"{low}-{high}"))
    return labels


def frequency_table(counts: dict[int, int] | dict[str, int], edges: list[int], real_links: np.ndarray,
                    links: np.ndarray, complexity_buckets: list[dict]) -> list[BucketRow]:
    """One row per bucket. ``counts``: source id -> count in the real data (every real source word);
    ``real_links``/``links``: ``linked_pairs`` of the real data and of the set (same vocabularies);
    ``complexity_buckets``: the set's ``ComplexityScore.by_frequency`` with the same edges."""
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    freq = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
    bucket_of_word = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, dtype=np.int64)
    bucket_of_word[ids] = np.searchsorted(np.asarray(edges), freq, side="right") - 1
    real_x = real_links >> 32
    kept = np.isin(real_links, links)
    pair_bucket = bucket_of_word[real_x]  # every real source word is counted
    # per real source word: does any of its pairs survive?
    words_with_pairs, first = np.unique(real_x, return_index=True)
    survives = np.logical_or.reduceat(kept, first) if len(first) else np.zeros(0, dtype=bool)
    word_bucket = pair_bucket[first]
    rows = []
    for i, label in enumerate(bucket_labels(edges)):
        in_bucket = pair_bucket == i
        rows.append(BucketRow(
            bucket=label, words=int((bucket_of_word[ids] == i).sum()),
            complexity=complexity_buckets[i]["complexity"], real_pairs=int(in_bucket.sum()),
            kept=float(kept[in_bucket].mean()) if in_bucket.any() else float("nan"),
            words_losing_all=int(((word_bucket == i) & ~survives).sum())))
    return rows


def vocabularies(real: MeasuredSet) -> tuple[Vocabulary, Vocabulary]:
    """The source and target vocabularies that every set of one report shares (computed once, on the real data's
    MeasuredSet), so that their pair keys agree."""
    return Vocabulary(), Vocabulary()


def linked(data: MeasuredSet) -> tuple[np.ndarray, Counter]:
    """The set's linked word pairs (``linked_pairs``) and its source-word counts, from the tokens the aligner saw.
    The real data's come first (its row is measured first), and the other sets are held to them."""
    counts = Counter()

    def counted():
        for src, tgt in data.tokenized_pairs():
            counts.update(src)
            yield src, tgt

    return linked_pairs(counted(), data.aligned.result.alignment_shards(), *data.real.once(vocabularies)), counts


def real_source_counts(data: MeasuredSet) -> Counter:
    """Each source word's count in the real data."""
    return data.real.once(linked)[1]


def bucket_rows(data: MeasuredSet) -> list[BucketRow]:
    """The set's ``frequency_table`` against the real data, with the report's bucket edges."""
    real_links, counts = data.real.once(linked)
    source_ids, edges = data.real.once(vocabularies)[0].ids, data.settings.buckets
    return frequency_table({source_ids[w]: c for w, c in counts.items()}, edges, real_links, data.once(linked)[0],
                           data.once(complexity_score).by_frequency(counts, edges))


class SourceFrequencyBuckets(Measure):
    """The bucket table: per bucket of source-word frequency, C(d), the real pairs kept, the words losing all."""

    name, label = "frequency_buckets", "source words by their count in the real data"

    def corpus_score(self, data: MeasuredSet) -> list[dict]:
        return [row.as_dict() for row in data.once(bucket_rows)]


class WordsLosingAll(Measure):
    """The source words that lose every translation the real data links them to: the bucket table's last column,
    summed. (``missing_words``, source words absent from the distilled table, is 0 whenever the sources are the
    real ones, and says nothing of translations.)"""

    name, label, relative = "words_losing_all", "words losing every translation", True
    tables = {REPORT: Column(before="reordering"), CARD: Column(before="reordering")}

    def corpus_score(self, data: MeasuredSet) -> int:
        return sum(row.words_losing_all for row in data.once(bucket_rows))


class TokenWeightedComplexity(Measure):
    """C(d) over source tokens: each word's entropy weighted by its count in the real data
    (``ComplexityScore.token_weighted``)."""

    name, label, format, needs = "complexity_token_weighted", "C(d) token-weighted", ".3f", DETAILS
    tables = {RANKING: Column(), CENTRAL: Column(), CORRELATION: Column("C(d), token-weighted")}

    def corpus_score(self, data: MeasuredSet) -> float:
        return data.once(complexity_score).token_weighted(real_source_counts(data))


class ComplexityByFrequency(Measure):
    """C(d) within each bucket of source-word frequency (``ComplexityScore.by_frequency``)."""

    name, label, needs = "complexity_buckets", "C(d) by source-word frequency", DETAILS

    def corpus_score(self, data: MeasuredSet) -> list[dict]:
        return data.once(complexity_score).by_frequency(real_source_counts(data), data.settings.buckets)
