"""The study's central table (Zhou, Gu & Neubig, ICLR 2020, Table 2): each training set's data measures beside
the NAT student trained on it, and whether the measures predict the student.

From the step records only, like the rest of the results: the analysis step's rows, the students' validation
and test BLEU, their test hypotheses (for sacrebleu's paired bootstrap against the student on the beam set),
and the students of the extra seeds (the seed-to-seed spread printed beside every gap).
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from nat_kd.analysis.metrics import shown
from nat_kd.analysis.metrics.base import CENTRAL, CORRELATION
from nat_kd.analysis.plotting import legend_outside, plt, save_figure, scatter_sets, set_style
from nat_kd.artifacts import PreparedCorpus
from nat_kd.corpus import read_lines
from nat_kd.markdown import cell, table

from .config import StudyConfig
from nat_kd.engine.steps import student_step

# The study's own figures, WMT14 en-de, one AT-base teacher decoding four ways, a vanilla NAT student on each
# (Zhou, Gu & Neubig 2020, Table 2); and its base against base-inter (the n-best reranked by sentence BLEU
# against the reference), whose BLEU is another student's (Table 4), so it is not comparable with the rest.
PAPER = {"sampling": (3.623, 3.354, 6.6), "topk": (2.411, 2.932, 14.6), "greedy": (1.960, 2.959, 18.9),
         "beam": (1.902, 2.948, 19.5), "seq-inter": (1.908, 2.916, None)}
PAPER_NOTE = ("Paper: Zhou, Gu & Neubig (ICLR 2020), WMT14 en-de, AT-base teacher, vanilla NAT student. Their "
              "seq-inter row is base-inter against base (C 1.908 / 1.902, F 2.916 / 2.948, BLEU 27.32 / 26.94 with "
              "another student), so its BLEU is left out here.")
BOOTSTRAP_SAMPLES = 1000  # sacrebleu's default; its seed is fixed (12345), so the p-values are reproducible

def measure(row: dict, key: str):
    if key.startswith("bucket:"):
        bucket = key.split(":", 1)[1]
        return next((b["complexity"] for b in row.get("complexity_buckets", []) if b["bucket"] == bucket), None)
    return row.get(key)


def data_measures(rows: list[dict]) -> list[tuple[str, str]]:
    """(key, label) of the measures correlated with the student's test BLEU: those of the registry's CORRELATION
    table, then C(d) within each source-frequency bucket; only those that every row holds."""
    registered = [(m.name, column.label) for m, column in shown(CORRELATION)]
    buckets = [(f"bucket:{b['bucket']}", f"C(d), source words seen {b['bucket']}")
               for b in (rows[0].get("complexity_buckets", []) if rows else [])]
    return [(k, label) for k, label in registered + buckets if rows and all(measure(r, k) is not None for r in rows)]


def _family(cfg: StudyConfig) -> str:
    return cfg.student_families[0]


def _beam_label(cfg: StudyConfig) -> str | None:
    return next((d.name for d in cfg.distilled if d.strategy == "beam"), None)


def seed_spread(cfg: StudyConfig, res: dict, family: str) -> dict[str, list[float]]:
    """label -> the test BLEU of every seed trained on it (seed 1 first), for the sets with extra seeds."""
    out = {}
    for label in cfg.seed_sets.get(family, ()):
        scores = [res.get(student_step(family, label, seed), {}).get("test_bleu")
                  for seed in (1, *cfg.student_seeds)]
        out[label] = [s for s in scores if s is not None]
    return out


def pooled_sd(spread: dict[str, list[float]]) -> float | None:
    """The seed-to-seed standard deviation, pooled over the sets with two seeds or more."""
    variances = [(len(v) - 1, statistics.variance(v)) for v in spread.values() if len(v) >= 2]
    dof = sum(d for d, _ in variances)
    return math.sqrt(sum(d * v for d, v in variances) / dof) if dof else None


def paired_bootstrap(baseline: list[str], systems: dict[str, list[str]], references: list[str]) -> dict[str, float]:
    """sacrebleu's paired bootstrap resampling (as ``sacrebleu --paired-bs``) of each system against
    ``baseline``: name -> p-value."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if not systems:
        return {}
    named = [("baseline", baseline), *systems.items()]
    test = PairedTest(named, {"BLEU": BLEU()}, [references], test_type="bs", n_samples=BOOTSTRAP_SAMPLES)
    _, scores = test()
    return {name: result.p_value for name, result in zip(scores["System"][1:], scores["BLEU"][1:])}


def p_values_against(cfg: StudyConfig, res: dict, students: dict[str, dict], best: str) -> dict[str, float]:
    """sacrebleu's paired bootstrap of each set's student (``students``: set -> its record) against the one on
    set ``best``: set -> p, where the test outputs are on this machine ({} with fewer than two)."""
    outputs = {label: r["test_hypotheses"] for label, r in students.items()
               if r.get("test_hypotheses") and Path(r["test_hypotheses"]).is_file()}
    if best not in outputs or len(outputs) < 2:
        return {}
    references = read_lines(PreparedCorpus(res["prepare"]["dir"]).raw("test", cfg.tgt))
    return paired_bootstrap(read_lines(outputs[best]),
                            {label: read_lines(path) for label, path in outputs.items() if label != best}, references)


# the real data and two distilled sets: with one, "Does distillation help each student?" already says it all
MIN_SETS_FOR_TABLE = 3
MIN_SETS_FOR_CORRELATION = 4  # with 3 sets, even a perfect rank order has an exact p of 1/3


# up to 9 sets the p-value is exact (9! = 362,880 orders, under a second); above, 10! orders take seconds
# a call and 12! hours, so random orders stand in for them
MAX_SETS_EXACT = 9
RANDOM_ORDERS = 100_000


def spearman(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Spearman's rho and its two-sided p-value over the orders of ``xs`` against the fixed ``ys``: exact over
    all n! orders up to MAX_SETS_EXACT sets, else over RANDOM_ORDERS seeded random ones. With a handful of
    training sets the large-sample approximation of scipy.stats.spearmanr is far off. Two-sided is twice the
    smaller one-sided p (scipy's convention): exact where one side has no ties, conservative where both do."""
    import numpy as np
    from scipy.stats import permutation_test, rankdata, spearmanr

    y = rankdata(ys)
    y = y - y.mean()

    def rho(x, axis):
        rx = rankdata(x, axis=axis)
        rx = rx - rx.mean(axis=axis, keepdims=True)
        return (rx * y).sum(axis=axis) / np.sqrt((rx ** 2).sum(axis=axis) * (y ** 2).sum())

    statistic = float(spearmanr(xs, ys).statistic)
    if math.isnan(statistic):  # a constant measure: no order to compare
        return statistic, float("nan")
    exact = len(xs) <= MAX_SETS_EXACT
    # one sample under "pairings": only its order is permuted (n! nulls; with both samples it would be n!^2);
    # in batches, so that memory stays bounded whatever n
    test = permutation_test((np.asarray(xs, float),), rho, permutation_type="pairings", vectorized=True,
                            n_resamples=np.inf if exact else RANDOM_ORDERS, batch=40320,
                            random_state=None if exact else np.random.default_rng(0), alternative="two-sided")
    return statistic, float(test.pvalue)


def p_value_cell(p: float) -> str:
    """Three decimals, or two significant digits below 0.001, where exact p-values of 7 or 8 sets lie
    (a perfect rank order of 8: 2 / 8! = 5.0e-05), so that none reads 0.000."""
    return cell(p, ".3f" if math.isnan(p) or p >= 0.001 else ".1e")


def _rows(cfg: StudyConfig, res: dict) -> list[dict]:
    """One row a training set that has an analysis row: its measures and its student's results."""
    analysis = {row["name"]: row for row in res.get("analysis", {}).get("rows", [])}
    strategies = ({d.name: d.strategy for d in cfg.distilled} | {m.name: f"mix of {m.of}" for m in cfg.mixes}
                  | {r.name: r.description() for r in cfg.references})
    family, out = _family(cfg), []
    for label in cfg.data_labels():
        if label not in analysis:
            continue
        student = res.get(student_step(family, label), {})
        out.append({"label": label, "strategy": strategies.get(label, "reference"), "analysis": analysis[label],
                    "valid": student.get("valid_bleu"), "test": student.get("test_bleu"),
                    "hypotheses": student.get("test_hypotheses")})
    return out


def central_section(cfg: StudyConfig, res: dict, out: Path, paths: dict) -> list[str]:
    """The central table, the seed spread, the correlations and their figure (Markdown parts); [] before the
    analysis has run, without students, or when the study has fewer than two distilled sets to choose from."""
    rows = _rows(cfg, res)
    if len(rows) < MIN_SETS_FOR_TABLE or not cfg.student_families:
        return []
    family = _family(cfg)
    spread = seed_spread(cfg, res, family)
    sd = pooled_sd(spread)
    parts = _central_table(cfg, res, rows, sd)
    if spread:
        parts += ["### Seed-to-seed spread (test BLEU)\n",
                  table(["training set", "seeds", "test BLEU by seed", "mean", "sd", "range"],
                        [[label, len(v), ", ".join(f"{x:.2f}" for x in v),
                          cell(statistics.mean(v) if v else None, ".2f"),
                          cell(statistics.stdev(v) if len(v) > 1 else None, ".2f"),
                          cell(max(v) - min(v) if v else None, ".2f")] for label, v in spread.items()]),
                  (f"Pooled seed sd: {sd:.2f} BLEU; a gap between two single-seed students is within noise below "
                   f"about {2 * math.sqrt(2) * sd:.2f} (2 sd of a difference).\n" if sd is not None
                   else "(fewer than two seeds finished on any set)\n")]
    if len([r for r in rows if r["test"] is not None]) >= MIN_SETS_FOR_CORRELATION:
        parts += _correlations(rows, family, spread, out, paths)
    return parts


def _central_table(cfg: StudyConfig, res: dict, rows: list[dict], sd: float | None) -> list[str]:
    """The table of each set's measures (the registry's CENTRAL columns) beside its student, with the gap to the
    student on the beam set and its paired bootstrap p, and the paper's figures; then its note."""
    family, beam = _family(cfg), _beam_label(cfg)
    base = next((r for r in rows if r["label"] == beam), None)
    p_values = {}
    if base and base["hypotheses"] and Path(base["hypotheses"]).is_file():
        references = read_lines(PreparedCorpus(res["prepare"]["dir"]).raw("test", cfg.tgt))
        others = {r["label"]: read_lines(r["hypotheses"]) for r in rows
                  if r is not base and r["hypotheses"] and Path(r["hypotheses"]).is_file()}
        p_values = paired_bootstrap(read_lines(base["hypotheses"]), others, references)
    columns, body = shown(CENTRAL), []
    for r in rows:
        a, paper = r["analysis"], PAPER.get(r["strategy"], (None, None, None))
        gap = r["test"] - base["test"] if base and r["test"] is not None and base["test"] is not None else None
        gap_cell = "-" if gap is None or r is base else f"{gap:+.2f}"
        if gap is not None and r is not base and sd is not None:
            gap_cell += f" (seed sd {sd:.2f})"
        body.append([r["label"], r["strategy"], *(cell(a.get(m.name), column.format) for m, column in columns),
                     cell(r["valid"], ".2f"), cell(r["test"], ".2f"), gap_cell,
                     "baseline" if r is base else cell(p_values.get(r["label"]), ".4f"),
                     cell(paper[0], ".3f"), cell(paper[1], ".3f"), cell(paper[2], ".1f")])
    return [f"## The central table: which training data makes the best {family} student\n",
            table(["training set", "decoding", *(column.label for _, column in columns), "student valid BLEU",
                   "student test BLEU", f"test gap to {beam}", "paired bootstrap p", "paper C(d)", "paper F(d)",
                   "paper student BLEU"], body),
            f"Student: {family}, seed 1, checkpoint chosen on validation BLEU; test is test_2016_flickr. The gap is "
            f"test BLEU minus the {beam} student's; p: sacrebleu's paired bootstrap ({BOOTSTRAP_SAMPLES} resamples) "
            f"of the student's test output against the {beam} student's ('-' where a test output is not on this "
            "machine). Data measures as in the analysis above "
            "(13a, lowercased, the built-in fast_align). " + PAPER_NOTE + "\n"]


def _correlations(rows: list[dict], family: str, spread: dict[str, list[float]], out: Path,
                  paths: dict) -> list[str]:
    """Each data measure's Spearman correlation with the student's test BLEU over the sets that have one, and
    the figure of the student against C(d) (and against the best predictor, where it is another measure)."""
    scored = [r for r in rows if r["test"] is not None]
    corr = []
    for key, label in data_measures([r["analysis"] for r in scored]):
        rho, p = spearman([measure(r["analysis"], key) for r in scored], [r["test"] for r in scored])
        corr.append((key, label, rho, p))
    corr.sort(key=lambda c: -abs(c[2]) if not math.isnan(c[2]) else 0)
    parts = [f"### Do the data measures predict the student? Spearman rank correlation with {family} test BLEU "
             f"over {len(scored)} training sets\n",
             table(["data measure", "Spearman rho", "p (two-sided)"],
                   [[label, cell(rho, "+.3f"), p_value_cell(p)] for _, label, rho, p in corr])]
    panels = [("complexity", "C(d) as in the paper (mean over source types) [nats]"),
              ("complexity_token_weighted", "C(d) weighted by source-token count [nats]")]
    best_key, best_label, best_rho, _ = corr[0]
    if best_key not in dict(panels) and not math.isnan(best_rho):
        panels.append((best_key, f"{best_label}: the best predictor here (rho {best_rho:+.2f})"))
    paths["predict_figure"] = out / "student_bleu_vs_complexity.png"
    # all rows: each set keeps its colour and marker
    predict_figure(rows, family, paths["predict_figure"], spread, panels)
    parts.append(f"![student BLEU against C(d)]({paths['predict_figure'].name})\n")
    if len(panels) > 2:
        parts.append(f"(Right: against {best_label}, the best predictor of the table above.)\n")
    if any(len(v) >= 2 for v in spread.values()):
        parts.append("(A point is the seed-1 student; a vertical line spans the test BLEU of every seed trained "
                     "on that set.)\n")
    return parts


def predict_figure(rows: list[dict], family: str, path: Path, spread: dict[str, list[float]],
                   panels: list[tuple[str, str]]) -> None:
    """Student test BLEU against each data measure of ``panels`` ((key, axis label): the two C(d)s, and the
    best predictor where it is another measure), one point per set with a test BLEU, in the colour and marker
    its set has in every figure of the study (``set_style``); a vertical line through a set's point spans its
    seeds' test BLEU (``spread``: label -> every seed's, where it has two)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.25 * len(panels), 4.2), squeeze=False)
    axes = axes[0]
    for ax, (key, title) in zip(axes, panels):
        scatter_sets(ax, [(r["label"], measure(r["analysis"], key), r["test"]) for r in rows])
        for i, r in enumerate(rows):
            seeds, x = spread.get(r["label"], []), measure(r["analysis"], key)
            if len(seeds) >= 2 and x is not None:
                ax.vlines(x, min(seeds), max(seeds), colors=set_style(i)["color"], linewidth=1.5, zorder=2)
        ax.set(xlabel=title, ylabel=f"{family} student test BLEU")
        ax.margins(0.1)
        ax.grid(alpha=0.3)
    legend_outside(axes[-1])
    fig.suptitle("Do the data measures predict the student?", fontsize=10)
    save_figure(fig, path)
