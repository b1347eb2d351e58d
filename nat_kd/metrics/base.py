"""Shared pieces of the metrics: the settings signature, and raw text -> tokens -> fast_align results."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from nat_kd import __version__
from nat_kd.align import RECOMMENDED, AlignerOptions, AlignmentResult, FastAlign, run_fast_align_binary
from nat_kd.alignment_io import check_pair
from nat_kd.corpus import CorpusError
from nat_kd.tokenizers import Tokenizer

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

    def as_dict(self) -> dict:
        return {"metric": self.metric, **self.settings, "version": __version__}


def log_base_divisor(log_base: str) -> float:
    """Nats are natural; bits divide by ln 2."""
    if log_base == "e":
        return 1.0
    if log_base == "2":
        return math.log(2)
    raise ValueError(f"log base must be 'e' (nats) or '2' (bits), not {log_base!r}")


@dataclass
class AlignedCorpus:
    """A tokenised parallel corpus with its fast_align run, plus the settings that produced it."""

    src_tokens: list[str]
    tgt_tokens: list[str]
    result: AlignmentResult
    settings: dict
    dropped_empty: int = 0


def align_corpus(src: list[str], tgt: list[str], tokenizer: Tokenizer, options: AlignerOptions = RECOMMENDED,
                 aligner: str = "builtin", names: tuple[str, str] = ("source", "target"),
                 drop_empty: bool = False) -> AlignedCorpus:
    """Tokenise both sides, check them for what fast_align cannot read, and align them."""
    if len(src) != len(tgt):
        raise CorpusError(f"line-count mismatch: {names[0]} has {len(src)} lines but {names[1]} has {len(tgt)}; "
                          "parallel files must be line-aligned")
    src_tok, tgt_tok = tokenizer.corpus(src), tokenizer.corpus(tgt)
    dropped = 0
    if drop_empty:
        keep = [bool(s) and bool(t) for s, t in zip(src_tok, tgt_tok)]
        dropped = keep.count(False)
        src_tok = [s for s, k in zip(src_tok, keep) if k]
        tgt_tok = [t for t, k in zip(tgt_tok, keep) if k]
    for number, (s, t) in enumerate(zip(src_tok, tgt_tok), 1):
        if not s or not t or "|||" in s or "|||" in t:
            check_pair(s, t, number, *names)
    if not src_tok:
        raise CorpusError(f"{names[0]}: no sentence pairs left to align")
    if aligner == "builtin":
        result = FastAlign(options).align_lines(src_tok, tgt_tok)
    elif aligner == "fast_align":
        result = run_fast_align_binary(src_tok, tgt_tok, options)
    else:
        raise ValueError(f"unknown aligner {aligner!r}; choose one of {', '.join(ALIGNERS)}")
    settings = {**tokenizer.settings, "aligner": f"{aligner}({options.signature()})"}
    if drop_empty:
        settings["drop_empty"] = "yes"
    return AlignedCorpus(src_tok, tgt_tok, result, settings, dropped)
