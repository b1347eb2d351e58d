"""Does each KD method beat plain KD? A training set made from a distilled set by a method (a [[mixes]] set,
made from its ``of``; a [[references]] set, from the first set of its ``of``) against the same family's student
on that plain distilled set: the test BLEU of every seed, the difference of the seed means, sacrebleu's paired
bootstrap of the two seed-1 test outputs, and a verdict.

From the step records only, like the rest of the results.
"""
from __future__ import annotations

import functools
import statistics
from pathlib import Path
from typing import Callable

from nat_kd.artifacts import PreparedCorpus
from nat_kd.corpus import read_lines
from nat_kd.engine.steps import student_step
from nat_kd.markdown import table

from .central_table import BOOTSTRAP_SAMPLES, p_value_cell, paired_bootstrap
from .config import StudyConfig

SIGNIFICANCE = 0.05


def plain_sets(cfg: StudyConfig) -> dict[str, str]:
    """A method's training set -> the plain distilled set it was made from."""
    return {**{m.name: m.of for m in cfg.mixes}, **{r.name: r.of[0] for r in cfg.references}}


def verdict(first_seed: float, means: float, p: float | None) -> str:
    """Better or worse only where the seed-1 outputs differ beyond chance (p, of the seed-1 difference
    ``first_seed``) and the difference of the seeds' means goes the same way."""
    if p is None or p >= SIGNIFICANCE or first_seed * means <= 0:
        return "no difference shown"
    return "better than plain KD" if means > 0 else "worse than plain KD"


def _seeds(cfg: StudyConfig, res: dict, family: str, label: str) -> dict[int, float]:
    """The test BLEU of each seed trained so far, seed 1 first; {} until seed 1 has one."""
    scores = {seed: res.get(student_step(family, label, seed), {}).get("test_bleu")
              for seed in (1, *cfg.student_seeds)}
    return {seed: s for seed, s in scores.items() if s is not None} if scores[1] is not None else {}


def _difference(ours: dict[int, float], theirs: dict[int, float]) -> tuple[float, str]:
    """The difference of the means over the seeds both have (a seed trained on one side alone would move its
    mean by that seed's luck), and its cell, which names those seeds where either side has more."""
    shared = [seed for seed in ours if seed in theirs]
    difference = statistics.mean(ours[s] for s in shared) - statistics.mean(theirs[s] for s in shared)
    cell = f"{difference:+.2f}"
    if len(shared) < len({*ours, *theirs}):
        cell += f" (seed{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))}, which both have)"
    return difference, cell


def _outputs(res: dict, family: str, label: str) -> list[str] | None:
    """The seed-1 student's test output, where it is on this machine."""
    path = res.get(student_step(family, label), {}).get("test_hypotheses")
    return read_lines(path) if path and Path(path).is_file() else None


def _p_values(res: dict, family: str, scored: dict[str, str], references: Callable[[], list[str]]) -> dict[str, float]:
    """Each method's set (of ``scored``: method -> plain set) against its plain set: one paired bootstrap a
    plain set, of every method made from it whose test output is on this machine."""
    p_values = {}
    for plain in dict.fromkeys(scored.values()):
        baseline = _outputs(res, family, plain)
        systems = {m: out for m, p in scored.items() if p == plain and (out := _outputs(res, family, m))}
        if baseline is None or not systems:
            continue
        p_values.update(paired_bootstrap(baseline, systems, references()))
    return p_values


def kd_methods_section(cfg: StudyConfig, res: dict) -> list[str]:
    """The table (Markdown parts); [] until some family has a student on a method's set and on its plain set."""
    body, pairs = [], plain_sets(cfg)
    # read once, and only where some output is on this machine to test against them
    references = functools.cache(lambda: read_lines(PreparedCorpus(res["prepare"]["dir"]).raw("test", cfg.tgt)))
    for family in cfg.student_families:
        seeds = {label: _seeds(cfg, res, family, label) for label in {*pairs, *pairs.values()}}
        scored = {m: plain for m, plain in pairs.items() if seeds[m] and seeds[plain]}
        p_values = _p_values(res, family, scored, references)
        for method, plain in scored.items():
            ours, theirs, p = seeds[method], seeds[plain], p_values.get(method)
            difference, difference_cell = _difference(ours, theirs)
            body.append([family, method, plain, ", ".join(f"{x:.2f}" for x in ours.values()),
                         ", ".join(f"{x:.2f}" for x in theirs.values()), difference_cell,
                         "-" if p is None else p_value_cell(p), verdict(ours[1] - theirs[1], difference, p)])
    if not body:
        return []
    return ["## Does each KD method beat plain KD? (test BLEU against the same family on the plain set)\n",
            table(["student", "method's set", "plain KD set", "test BLEU by seed", "plain KD by seed",
                   "difference of the means", "paired bootstrap p", "verdict"], body),
            f"p: sacrebleu's paired bootstrap ({BOOTSTRAP_SAMPLES} resamples) of the seed-1 students' test outputs "
            "('-' where one is not on this machine). A method is better or worse than plain KD where p < "
            f"{SIGNIFICANCE} and the seeds' means differ the same way; otherwise no difference is shown. The means "
            "are over the seeds both students have.\n"]
