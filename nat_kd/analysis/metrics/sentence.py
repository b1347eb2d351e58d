"""Per-sentence scores of a distilled (or any) target against its reference: which lines hurt.

Columns, one row per line (``scores.tsv`` beside a distilled set, see docs/analysis.md):

* ``bleu``: sacrebleu's sentence BLEU (``sentence_bleu``: effective order, 13a, mixed case);
* ``chrf``: sacrebleu's chrF (character 6-grams, beta 2) of the one sentence;
* ``length_ratio``: words of the line / words of the reference (whitespace split, at least one), the
  per-line term of meta.json's ``mean_length_ratio``;
* ``repeated_ngrams``: how many n-gram positions of the line repeat an n-gram seen earlier in the same line
  (13a tokens, lowercased; n = 2 by default: "ein mann ein mann" repeats "ein mann" once); ``repeated`` is
  1 where that count is above zero;
* ``logprob``: the teacher's log-probability of the line divided by its length in tokens (EOS included):
  the mean of the decoder's per-token scores, whatever the length penalty. Only the generator knows it;
* ``replaced``: in a set written by nat_kd.mix, 1 where the line is the real target;
* each measure's per-line form (``Measure.line_column``), added by ``analyze report`` (it needs the corpus
  aligned): ``frs``, the line's fuzzy reordering score from the analysis aligner's links
  (``reordering.sentence_scores``; NaN when fewer than two source words are aligned), also added by
  ``analyze sentences --src``.

BLEU and chrF come from sacrebleu's per-sentence sufficient statistics (nat_kd.analysis.metrics.bleu), extracted
once: the generator sums the same statistics into its corpus scores (nat_kd.distill.scores), so nothing is
tokenised twice.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nat_kd.analysis.metrics.bleu import BleuStatistics, ChrfStatistics
from nat_kd.analysis.metrics.reordering import CONVENTIONS as FRS_CONVENTIONS
from nat_kd.analysis.metrics.surface import repeated_ngram_counts
from nat_kd.analysis.tokenizers import Tokenizer13a
from nat_kd.atomic import writing
from nat_kd.corpus import CorpusError, iter_lines

REPEAT_N = 2
# lines scored at a time where a file is scored a block at a time: sacrebleu's statistics and chrF's
# reference n-grams take about 30 kB a line while a block is scored (10,000 lines: 300 MB)
SCORE_BLOCK = 1000
# the columns of scores.tsv that no measure adds (a measure's per-line form, ``Measure.line_column``, is a column of
# its own): the scorer's, and nat_kd.mix's 0/1 ``replaced``
OWN_COLUMNS = ("bleu", "chrf", "length_ratio", "repeated_ngrams", "repeated", "logprob", "replaced")
INTEGER_COLUMNS = ("repeated_ngrams", "repeated", "replaced")  # counts and 0/1 flags, written as integers


def _metrics() -> dict:
    """The sentence-level metrics: sacrebleu.sentence_bleu's settings (effective order) and chrF's defaults."""
    return {"bleu": BleuStatistics(effective_order=True), "chrf": ChrfStatistics()}


def sacrebleu_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, list]:
    """Each line's sufficient statistics for BLEU and chrF (integers: n-gram matches and totals, lengths).
    They do not depend on the effective order, so the corpus scores sum these very lists."""
    return {name: metric.lines(hypotheses, references) for name, metric in _metrics().items()}


def length_ratio(hypothesis: str, reference: str) -> float:
    return len(hypothesis.split()) / max(1, len(reference.split()))


def repeated_ngrams(lines: Sequence[str], n: int = REPEAT_N, tokenizer=None) -> np.ndarray:
    """Per line, the n-gram positions that repeat an earlier n-gram of the same line (13a, lowercased)."""
    tokenizer = tokenizer or Tokenizer13a(lowercase=True)
    return repeated_ngram_counts([tokenizer(line) for line in lines], n)


@dataclass
class SentenceScores:
    """Per-line columns (numpy arrays, one value a line); ``columns`` holds only the ones measured."""

    columns: dict[str, np.ndarray]
    settings: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.columns:
            raise CorpusError(f"no per-sentence {name!r} here (have: {', '.join(self.columns)}); "
                              + ("only the generator records the teacher's log-probability" if name == "logprob"
                                 else "run python -m nat_kd.analyze sentences (or report) to add it"))
        return self.columns[name]

    def with_column(self, name: str, values) -> "SentenceScores":
        values = np.asarray(values, dtype=np.float64)
        if self.columns and len(values) != len(self):
            raise AssertionError(f"column {name} has {len(values)} values for {len(self)} lines; this is a bug")
        return SentenceScores({**self.columns, name: values}, self.settings)

    def write(self, path: str | Path) -> None:
        """A TSV with a header: ``line`` (1-based) then the measured columns; NaN written as ``nan``."""
        with writing(path) as out:
            out.writelines(self.tsv_lines())

    def tsv_lines(self, first: int = 1, header: bool = True) -> Iterator[str]:
        """The TSV's lines, its rows numbered from ``first``: a block of a file written a block at a time when
        ``first`` > 1 (then without the ``header``). Every column is written, in the order it was added."""
        names = list(self.columns)
        if header:
            yield "\t".join(["line", *names]) + "\n"
        cells = [self.columns[c].astype(np.int64).astype(str) if c in INTEGER_COLUMNS
                 else np.char.mod("%.6g", self.columns[c]) for c in names]
        for number, row in enumerate(zip(*cells), first):
            yield f"{number}\t" + "\t".join(row) + "\n"

    @classmethod
    def read(cls, path: str | Path) -> "SentenceScores":
        lines = iter_lines(path)
        header = next(lines, "").split("\t")
        if header[:1] != ["line"] or not all(header[1:]) or len(set(header)) != len(header):
            raise CorpusError(f"{path}:1: not a scores.tsv header (expected line, then the names of its columns, each "
                              "once); rewrite it with python -m nat_kd.analyze sentences")
        rows = []
        for number, line in enumerate(lines, 2):
            cells = line.split("\t")
            if len(cells) != len(header) or cells[0] != str(number - 1):
                raise CorpusError(f"{path}:{number}: expected {len(header)} tab-separated cells starting with "
                                  f"line number {number - 1}; the file is damaged, rewrite it")
            try:
                rows.append([float(c) for c in cells[1:]])
            except ValueError:
                raise CorpusError(f"{path}:{number}: a cell is not a number") from None
        values = np.array(rows, dtype=np.float64).reshape(len(rows), len(header) - 1)
        return cls({name: values[:, i] for i, name in enumerate(header[1:])})


class SentenceScorer:
    """Scores lines against their references; ``repeat_n`` is the n of the repetition count."""

    def __init__(self, repeat_n: int = REPEAT_N):
        self.repeat_n = repeat_n
        self.metrics = _metrics()
        self.tokenizer = Tokenizer13a(lowercase=True)

    @property
    def settings(self) -> dict:
        return {"bleu": self.metrics["bleu"].signature(), "chrf": self.metrics["chrf"].signature(),
                "repeated_ngrams": f"n:{self.repeat_n}|{self.tokenizer.signature}",
                "length_ratio": "words:whitespace", "logprob": "mean-over-tokens-with-eos|natural-log",
                "frs": FRS_CONVENTIONS}

    def score(self, hypotheses: Sequence[str], references: Sequence[str] | None,
              statistics: dict[str, list] | None = None, logprobs: Iterable[float] | None = None) -> SentenceScores:
        """Every column that the texts (and ``logprobs``, if given) determine; without references only the
        repetition count. ``statistics``: ``sacrebleu_statistics`` of the same lines, if already extracted."""
        counts = repeated_ngrams(hypotheses, self.repeat_n, self.tokenizer)
        columns = {}
        if references is not None:
            if len(references) != len(hypotheses):
                raise CorpusError(f"{len(hypotheses)} lines but {len(references)} references; they must be "
                                  "line-aligned")
            statistics = statistics or sacrebleu_statistics(hypotheses, references)
            for name, metric in self.metrics.items():
                columns[name] = np.array([metric.score(line).score for line in statistics[name]])
            columns["length_ratio"] = np.array([length_ratio(h, r) for h, r in zip(hypotheses, references)])
        columns["repeated_ngrams"] = counts.astype(np.float64)
        columns["repeated"] = (counts > 0).astype(np.float64)
        if logprobs is not None:
            columns["logprob"] = np.fromiter(logprobs, dtype=np.float64, count=len(hypotheses))
        return SentenceScores(columns, self.settings)


def summary(scores: SentenceScores, quantiles=(0.1, 0.25, 0.5, 0.75, 0.9)) -> dict:
    """Mean and quantiles of each column over the lines where it is defined (FRS is NaN on short lines)."""
    out = {}
    for name, values in scores.columns.items():
        valid = values[~np.isnan(values)]
        out[name] = {"lines": int(len(valid)), "mean": float(valid.mean()) if len(valid) else math.nan,
                     **{f"q{int(q * 100)}": float(np.quantile(valid, q)) if len(valid) else math.nan
                        for q in quantiles}}
    return out
