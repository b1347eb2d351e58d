"""Shared pieces of the metrics: the settings signature, raw text -> tokens -> fast_align results, and the
contract of a measure (``Measure``: what a report measures of each training set, and the tables that show it).
"""
from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from nat_kd import __version__
from nat_kd.analysis.align import RECOMMENDED, AlignerOptions, AlignmentResult, FastAlign, run_fast_align_binary
from nat_kd.analysis.formats import TranslationTable, check_pair
from nat_kd.corpus import CorpusError, iter_lines
from nat_kd.errors import SettingsError
from nat_kd.analysis.tokenizers import Tokenizer

if TYPE_CHECKING:
    import numpy as np

    from nat_kd.analysis.metrics.modes import UnigramModels

ALIGNERS = ("builtin", "fast_align")


@dataclass
class Signature:
    """The settings a number depends on, sacrebleu-style: ``name|key:value|...``.

    Two scores are comparable only when their signatures agree on every key but the metric name.
    """

    metric: str
    settings: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return "|".join([self.metric] + [f"{k}:{v}" for k, v in self.settings.items()] + [f"version:{__version__}"])

    def comparable(self, other: "Signature") -> bool:
        return self.settings == other.settings


def unit_name(log_base: str) -> str:
    """What a score computed with ``log_base`` is counted in."""
    log_base_divisor(log_base)  # refuses an unknown base
    return "bits" if log_base == "2" else "nats"


def log_base_divisor(log_base: str) -> float:
    """Nats are natural; bits divide by ln 2."""
    if log_base == "e":
        return 1.0
    if log_base == "2":
        return math.log(2)
    raise SettingsError(f"log base must be 'e' (nats) or '2' (bits), not {log_base!r}")


def check_floor(floor: float) -> None:
    """A smoothing floor is a probability that an unseen pair keeps: in (0, 1)."""
    if not 0 < floor < 1:
        raise SettingsError("the smoothing floor must be in (0, 1)")


@dataclass
class AlignedCorpus:
    """A tokenised parallel corpus's fast_align run, plus the settings that produced it."""

    result: AlignmentResult
    settings: dict
    pairs: int
    dropped_empty: int = 0
    dropped_lines: list[int] = field(default_factory=list)  # 1-based numbers of the dropped empty lines


TOKENIZE_BLOCK = 10_000  # lines tokenised at a time: a fixed buffer, whatever the corpus size


def parallel_lines(src: Iterable[str], tgt: Iterable[str], names: tuple[str, str]) -> Iterator[tuple[str, str]]:
    """Line pairs of two line-aligned texts; a length mismatch names both files and their line counts."""
    count = 0
    for count, (s, t) in enumerate(itertools.zip_longest(src, tgt), 1):
        if s is None or t is None:
            longer = src if t is None else tgt
            more = count + sum(1 for _ in longer)
            src_count, tgt_count = (more, count - 1) if t is None else (count - 1, more)
            raise CorpusError(f"line-count mismatch: {names[0]} has {src_count} lines but {names[1]} has "
                              f"{tgt_count}; parallel files must be line-aligned")
        yield s, t


class TokenizedPairs:
    """Tokenised (source, target) token lists of line pairs, checked for what fast_align cannot read: what the
    aligner sees, for any measure that must count the same tokens.

    Iterated once, a block of lines at a time; afterwards ``pairs`` and ``dropped`` hold the counts, and
    ``dropped_lines`` the 1-based numbers of the lines dropped.
    """

    def __init__(self, lines: Iterable[tuple[str, str]], tokenizer: Tokenizer, names: tuple[str, str],
                 drop_empty: bool):
        self.lines, self.tokenizer, self.names, self.drop_empty = lines, tokenizer, names, drop_empty
        self.pairs = self.dropped = 0
        self.dropped_lines: list[int] = []

    def __iter__(self) -> Iterator[tuple[list[str], list[str]]]:
        lines, number = iter(self.lines), 0
        while block := list(itertools.islice(lines, TOKENIZE_BLOCK)):
            src, tgt = zip(*block)
            for s, t in zip(self.tokenizer.corpus(src), self.tokenizer.corpus(tgt)):
                number += 1
                if not s or not t or "|||" in s or "|||" in t:
                    if self.drop_empty and (not s or not t):
                        self.dropped += 1
                        self.dropped_lines.append(number)
                        continue
                    check_pair(s, t, number, *self.names)
                self.pairs += 1
                yield s.split(), t.split()
        if not self.pairs:
            found = (f"every one of its {self.dropped} sentence pairs has an empty side" if self.dropped
                     else "no sentence pairs")
            raise CorpusError(f"{self.names[0]} and {self.names[1]}: {found}, nothing to align; check that both "
                              "hold text")


def align_corpus(src: Iterable[str], tgt: Iterable[str], tokenizer: Tokenizer,
                 options: AlignerOptions = RECOMMENDED, aligner: str = "builtin",
                 names: tuple[str, str] = ("source", "target"), drop_empty: bool = False,
                 links: bool = True) -> AlignedCorpus:
    """Tokenise both sides of line-aligned text, check them for what fast_align cannot read, and align them.

    ``src`` and ``tgt`` are raw lines, read once: lists, or ``corpus.iter_lines`` of two files for a corpus of
    any size. ``links=False`` skips the final (Viterbi) pass when only the table is needed.
    """
    return align_line_pairs(parallel_lines(src, tgt, names), tokenizer, options, aligner, names, drop_empty, links)


def align_line_pairs(lines: Iterable[tuple[str, str]], tokenizer: Tokenizer,
                     options: AlignerOptions = RECOMMENDED, aligner: str = "builtin",
                     names: tuple[str, str] = ("source", "target"), drop_empty: bool = False,
                     links: bool = True) -> AlignedCorpus:
    """``align_corpus`` for (source line, target line) pairs."""
    pairs = TokenizedPairs(lines, tokenizer, names, drop_empty)
    if aligner == "builtin":
        result = FastAlign(options).align(pairs, viterbi=links)
    elif aligner == "fast_align":
        checked = [(" ".join(s), " ".join(t)) for s, t in pairs]
        result = run_fast_align_binary([s for s, _ in checked], [t for _, t in checked], options)
    else:
        raise SettingsError(f"unknown aligner {aligner!r}; choose one of {', '.join(ALIGNERS)}")
    settings = {**tokenizer.settings, "aligner": f"{aligner}({options.signature()})"}
    if drop_empty:
        settings["drop_empty"] = "yes"
    return AlignedCorpus(result, settings, pairs.pairs, pairs.dropped, pairs.dropped_lines)


# The tables that show measures (``Measure.tables``): the analysis report's (report.md), the dataset card's
# data measures, nat_kd.choose's ranking, and the study's tables (nat_kd.study): the central table, its
# correlations with the students' BLEU (row labels and figure axes), the table of its training sets
REPORT, CARD, RANKING, CENTRAL, CORRELATION, DECODING = "report", "card", "ranking", "central", "correlation", \
    "decoding"
# What a measure may need beyond the aligned corpora (``Measure.needs``): per-language texts (analyze report
# --lang), or the detailed report's settings (DetailedAnalysisReport)
MODES, DETAILS = "modes", "details"


@dataclass(frozen=True)
class Column:
    """How one table shows a measure: its header and number format (None: the measure's own), and, where the
    table puts it elsewhere than the registry's order, the measure whose column it stands before."""

    label: str | None = None
    format: str | None = None
    before: str | None = None


@dataclass(frozen=True)
class MeasureSettings:
    """A report's settings, as its measures read them. ``floors``, ``interpolation`` and ``repeat_n`` are the
    detailed report's; ``modes`` the unigram models of the mode mix."""

    tokenizer: Tokenizer
    drop_empty: bool
    log_base: str
    floor: float
    buckets: tuple[int, ...]
    floors: tuple[float, ...] = ()
    interpolation: float | None = None
    repeat_n: tuple[int, ...] = ()
    modes: UnigramModels | None = None

    def __post_init__(self):  # refused before anything is aligned
        log_base_divisor(self.log_base)
        for floor in (self.floor, *self.floors):
            check_floor(floor)


T = TypeVar("T")


class MeasuredSet:
    """One training set as measures see it: its text files, its aligned corpus, the report's settings, and the
    real data's MeasuredSet (``real``: itself for the real data), whose lines its own pair with ``real_repeats``
    times over (a union set's). What several measures need is computed once per set (``once``); what every set
    of a report shares, once on the real data's."""

    def __init__(self, name: str, src: Path, tgt: Path, aligned: AlignedCorpus, settings: MeasureSettings,
                 real: MeasuredSet | None = None, real_repeats: int = 1):
        self.name, self.src, self.tgt, self.aligned, self.settings = name, src, tgt, aligned, settings
        self.real, self.real_repeats = real or self, real_repeats
        self._computed: dict[Callable, Any] = {}

    @cached_property
    def table(self) -> TranslationTable:
        """The aligner's translation table (fast_align -p)."""
        return self.aligned.result.exported_table()

    def once(self, compute: Callable[[MeasuredSet], T]) -> T:
        """``compute(self)``, computed on the first call only."""
        if compute not in self._computed:
            self._computed[compute] = compute(self)
        return self._computed[compute]

    def tokenized_pairs(self) -> TokenizedPairs:
        """The tokens the aligner saw, tokenised again (a block of lines at a time)."""
        names = (str(self.src), str(self.tgt))
        return TokenizedPairs(parallel_lines(iter_lines(self.src), iter_lines(self.tgt), names),
                              self.settings.tokenizer, names, self.settings.drop_empty)


def pairs_in_memory(data: MeasuredSet) -> list[tuple[list[str], list[str]]]:
    """The tokens the aligner saw, held in memory (``data.once(pairs_in_memory)``): for the detailed report's
    measures, which are for corpora of Multi30k's size."""
    return list(data.tokenized_pairs())


class Measure(ABC):
    """A number that describes a training set: one entry of an analysis report's rows, computed for the real data
    and for every distilled set. sacrebleu's ``Metric`` is the model: a subclass sets the class attributes and
    implements ``corpus_score``, and ``nat_kd.analysis.metrics.register_measure`` adds it to ``MEASURES``; the
    report, the card, choose's ranking and the study's tables show it where its ``tables`` say
    (docs/extending.md)."""

    name: ClassVar[str]  # its key in a report's rows (report.json), the card and the study's records
    label: ClassVar[str]  # its column header, where a table gives it none of its own
    format: ClassVar[str] = ""  # the format spec of its number there ("": as it is)
    tables: ClassVar[Mapping[str, Column]] = {}  # table (REPORT, CARD, RANKING, ...) -> how that table shows it
    needs: ClassVar[str | None] = None  # MODES or DETAILS: measured only by the reports that have them
    relative: ClassVar[bool] = False  # measures a set against the real data, so none for the real data in the card
    # its per-line form: a column of each set's scores.tsv and a histogram of its card, from ``line_scores``
    line_column: ClassVar[str | None] = None

    def __init__(self, settings: MeasureSettings):
        self.settings = settings

    @abstractmethod
    def corpus_score(self, data: MeasuredSet) -> Any:
        """Its value for one set: a number for the tables, or any JSON value for the report's details."""

    def line_scores(self, data: MeasuredSet) -> np.ndarray:
        """Each input line's score (NaN where it has none), for a measure with a ``line_column``."""
        raise NotImplementedError(f"{self.name} has no per-line scores")

    def signature_settings(self) -> dict:
        """The settings its number depends on beyond the tokeniser and the aligner; a measure with some carries a
        signature of its own (``signature``) in the report and the card."""
        return {}

    def signature(self, aligned_settings: dict) -> Signature:
        return Signature(self.name, {**aligned_settings, **self.signature_settings()})
