"""Shared pieces of the metrics: the settings signature, and raw text -> tokens -> fast_align results."""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from nat_kd import __version__
from nat_kd.analysis.align import RECOMMENDED, AlignerOptions, AlignmentResult, FastAlign, run_fast_align_binary
from nat_kd.analysis.formats import check_pair
from nat_kd.corpus import CorpusError
from nat_kd.errors import SettingsError
from nat_kd.analysis.tokenizers import Tokenizer

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
