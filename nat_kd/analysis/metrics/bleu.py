"""sacrebleu's BLEU and chrF from each line's sufficient statistics, summed as the lines go by; and the report's
BLEU and length ratio of a set's targets against the real ones.

sacrebleu scores a corpus from integer statistics of each line (n-gram matches and totals, lengths) summed, so
the sums of any split of the lines give its corpus_score exactly. They are kept per line (the sentence scores of
scores.tsv), per chunk (the generator's decoding processes; the merge adds the chunks' sums) or only as running
sums (``streamed_bleu``: a corpus of any size in the memory of one line).

BLEU goes through sacrebleu's public API: ``sentence_score`` gives a line's statistics (its BLEUScore's
``sys_len``, ``ref_len``, ``counts`` and ``totals``), and the static ``BLEU.compute_bleu`` the score of summed
ones. chrF has no public path to them (a CHRFScore keeps only its score), so ``ChrfStatistics`` wraps the two
private methods that corpus_score itself runs; sacrebleu is pinned (scripts/constraints.txt), and the tests
hold both classes equal to corpus_score. sacrebleu is imported where it is used, as the report's other
measures need none of it.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from nat_kd.analysis.metrics.base import (CENTRAL, CORRELATION, DECODING, RANKING, REPORT, Column, Measure,
                                          MeasuredSet, parallel_lines)
from nat_kd.corpus import CorpusError, iter_lines


class BleuStatistics:
    """BLEU (13a, one reference a line) from statistics in sacrebleu's layout: ``[hypothesis length,
    reference length, matches of 1..4-grams, totals of 1..4-grams]``."""

    def __init__(self, lowercase: bool = False, effective_order: bool = False):
        import sacrebleu

        self.metric = sacrebleu.BLEU(lowercase=lowercase, effective_order=effective_order)
        # a line's statistics do not depend on the effective order (its score does), and sentence_score warns
        # on every line scored without it
        self._lines = sacrebleu.BLEU(lowercase=lowercase, effective_order=True)

    def line(self, hypothesis: str, reference: str) -> list[int]:
        score = self._lines.sentence_score(hypothesis, [reference])
        return [score.sys_len, score.ref_len, *score.counts, *score.totals]

    def lines(self, hypotheses: Sequence[str], references: Sequence[str]) -> list[list[int]]:
        return [self.line(h, r) for h, r in zip(hypotheses, references)]

    def score(self, statistics: Sequence[int]):
        """sacrebleu's BLEUScore of one line's statistics, or of summed ones."""
        n, metric = self.metric.max_ngram_order, self.metric
        return metric.compute_bleu(list(statistics[2:2 + n]), list(statistics[2 + n:]), statistics[0], statistics[1],
                                   smooth_method=metric.smooth_method, smooth_value=metric.smooth_value,
                                   effective_order=metric.effective_order, max_ngram_order=n)

    def signature(self) -> str:
        return _signature(self.metric)


class ChrfStatistics:
    """chrF (character 6-grams, beta 2) from sacrebleu's statistics: per n-gram order, the hypothesis's and the
    reference's n-grams and their matches."""

    def __init__(self):
        import sacrebleu

        self.metric = sacrebleu.CHRF()

    def lines(self, hypotheses: Sequence[str], references: Sequence[str]) -> list[list[int]]:
        return self.metric._extract_corpus_statistics(list(hypotheses), [list(references)])

    def score(self, statistics: Sequence[int]):
        """sacrebleu's CHRFScore of one line's statistics, or of summed ones."""
        return self.metric._compute_score_from_stats(list(statistics))

    def signature(self) -> str:
        return _signature(self.metric)


def _signature(metric) -> str:
    """sacrebleu's signature of ``metric`` against one reference a line: sacrebleu counts the references
    (nrefs) only when it is given some to score."""
    metric.corpus_score([""], [[""]])
    return str(metric.get_signature())


def summed(statistics: Iterable[Sequence[int]]) -> list[int]:
    """Lines' (or chunks') statistics added up, element by element."""
    total = None
    for stats in statistics:
        total = list(stats) if total is None else [a + b for a, b in zip(total, stats)]
    if total is None:
        raise CorpusError("no lines to score")
    return total


def streamed_bleu(pairs: Iterable[tuple[str, str]], lowercase: bool = False):
    """Corpus BLEU of (hypothesis, reference) pairs read once: each line's statistics join running sums and are
    dropped, so memory holds one line whatever the corpus. The BLEUScore is sacrebleu's corpus_score of the same
    lines."""
    bleu = BleuStatistics(lowercase)
    return bleu.score(summed(bleu.line(h, r) for h, r in pairs))


def bleu_against_real(data: MeasuredSet):
    """The set's targets against the real ones (as many times over as the set pairs with them), as the report's
    tokeniser cases them."""
    repeats = data.real_repeats
    names = (str(data.tgt), f"{data.real.tgt}" + (f" (read {repeats} times over)" if repeats > 1 else ""))
    references = itertools.chain.from_iterable(iter_lines(data.real.tgt) for _ in range(repeats))
    return streamed_bleu(parallel_lines(iter_lines(data.tgt), references, names), data.settings.tokenizer.lowercase)


VS_REAL = Column("BLEU vs real")


class BleuVsReal(Measure):
    """Corpus BLEU of the set's targets against the real targets."""

    name, label, format, relative = "bleu", "BLEU", ".2f", True
    tables = {REPORT: Column(), RANKING: VS_REAL, CENTRAL: VS_REAL, DECODING: VS_REAL, CORRELATION: VS_REAL}

    def corpus_score(self, data: MeasuredSet) -> float:
        return data.once(bleu_against_real).score


class LengthRatio(Measure):
    """The set's target length over the real one's, in BLEU's tokens over the whole corpus."""

    name, label, format, relative = "length_ratio", "len ratio", ".3f", True
    tables = {REPORT: Column(), RANKING: Column("length ratio", before="bleu"), CENTRAL: Column("length ratio"),
              DECODING: Column("length ratio"), CORRELATION: Column("length ratio vs real")}

    def corpus_score(self, data: MeasuredSet) -> float:
        bleu = data.once(bleu_against_real)
        return bleu.sys_len / bleu.ref_len if bleu.ref_len else math.nan
