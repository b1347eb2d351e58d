"""Does distillation help each student family? Every seed-1 student against the same family's seed-1 student
on the real data: the gain in test BLEU, sacrebleu's paired bootstrap of the two test outputs, and how fast
each trained.

From the step records only, like the rest of the results.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from nat_kd.artifacts import PreparedCorpus
from nat_kd.corpus import read_lines
from nat_kd.markdown import cell, table

from .central_table import BOOTSTRAP_SAMPLES, paired_bootstrap
from .config import StudyConfig
from nat_kd.engine.steps import student_step


def updates_per_second(curve: list[dict]) -> float | None:
    """The median over a curve's chunks of updates trained / seconds: a chunk resumed after a kill counts all
    its updates in part of the time, and the median leaves it out."""
    rates, previous = [], 0
    for point in curve:
        if point["train_seconds"] > 0 and point["updates"] > previous:
            rates.append((point["updates"] - previous) / point["train_seconds"])
        previous = point["updates"]
    return statistics.median(rates) if rates else None


def gains_section(cfg: StudyConfig, res: dict) -> list[str]:
    """The gains table (Markdown parts); [] until some family has a student on the real data and on another
    set."""
    references = None
    body = []
    for family in cfg.student_families:
        real = res.get(student_step(family, "real"), {})
        if real.get("test_bleu") is None:
            continue
        others = {label: res.get(student_step(family, label), {}) for label in cfg.data_labels()[1:]}
        others = {label: r for label, r in others.items() if r.get("test_bleu") is not None}
        if not others:
            continue
        outputs = {label: r["test_hypotheses"] for label, r in others.items()
                   if r.get("test_hypotheses") and Path(r["test_hypotheses"]).is_file()}
        p_values = {}
        if outputs and real.get("test_hypotheses") and Path(real["test_hypotheses"]).is_file():
            if references is None:
                references = read_lines(PreparedCorpus(res["prepare"]["dir"]).raw("test", cfg.tgt))
            p_values = paired_bootstrap(read_lines(real["test_hypotheses"]),
                                        {label: read_lines(path) for label, path in outputs.items()}, references)
        for label, r in [("real", real), *others.items()]:
            gain = None if label == "real" else r["test_bleu"] - real["test_bleu"]
            body.append([family, label, cell(r["test_bleu"], ".2f"), "-" if gain is None else f"{gain:+.2f}",
                         "baseline" if label == "real" else cell(p_values.get(label), ".4f"),
                         cell(updates_per_second(r["curve"]) if r.get("curve") else None, ".2f"),
                         r.get("updates_trained", "-")])
    if not body:
        return []
    return ["## Does distillation help each student? (test BLEU against the same family on the real data)\n",
            table(["student", "training data", "test BLEU", "gain over real", "paired bootstrap p", "updates/s",
                   "updates trained"], body),
            f"p: sacrebleu's paired bootstrap ({BOOTSTRAP_SAMPLES} resamples) of the student's test output against "
            "the same family's student on the real data ('-' where a test output is not on this machine). "
            "updates/s: the median over the training's validation chunks, under the study's own load (steps "
            "side by side share the machine): a rough figure, not a benchmark.\n"]
