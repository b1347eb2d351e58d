"""Which training data suits which student? Zhou, Gu & Neubig's claim (c): a weak student learns best from
simple data, a stronger one from more complex, more faithful data. Every student family against every
training set: test BLEU, each family's best set and the paired bootstrap of every other set against it, the
seed spread, each data measure's rank correlation with the family's BLEU, and a figure of BLEU against
token-weighted C(d), one line per family.

From the step records only, like the rest of the results.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from nat_kd.analysis.plotting import legend_outside, plt, save_figure, set_style
from nat_kd.markdown import cell, table

from .central_table import (BOOTSTRAP_SAMPLES, MIN_SETS_FOR_CORRELATION, MIN_SETS_FOR_TABLE, measure, data_measures,
                            p_value_cell, p_values_against, pooled_sd, seed_spread, spearman)
from .config import StudyConfig
from nat_kd.engine.steps import student_step

X_MEASURE = ("complexity_token_weighted", "C(d) weighted by source-token count [nats]")


def _grid(cfg: StudyConfig, res: dict) -> tuple[dict, dict]:
    """The analysis rows of the sets that have one, and family -> set -> its seed-1 student's result (the
    students with a test BLEU)."""
    analysis = {row["name"]: row for row in res.get("analysis", {}).get("rows", [])}
    sets = [label for label in cfg.data_labels() if label in analysis]
    grid = {family: {label: r for label in sets if (r := res.get(student_step(family, label), {})).get("test_bleu")
                     is not None} for family in cfg.student_families}
    return {label: analysis[label] for label in sets}, grid


def _seed_spread_section(spreads: dict) -> list[str]:
    """The cells trained with more than one seed: their test BLEU by seed, mean, sd and range."""
    seeded = {(family, label): v for family, spread in spreads.items() for label, v in spread.items() if len(v) > 1}
    if not seeded:
        return []
    sd = pooled_sd({f"{f} {label}": v for (f, label), v in seeded.items()})
    return ["### Seed spread (test BLEU)\n",
            table(["student", "training set", "test BLEU by seed", "mean", "sd", "range"],
                  [[f, label, ", ".join(f"{x:.2f}" for x in v), cell(statistics.mean(v), ".2f"),
                    cell(statistics.stdev(v), ".2f"), cell(max(v) - min(v), ".2f")]
                   for (f, label), v in seeded.items()]),
            f"Pooled seed sd: {cell(sd, '.2f')} BLEU.\n"]


def family_section(cfg: StudyConfig, res: dict, out: Path, paths: dict) -> list[str]:
    """Markdown parts; [] for a study of one family, or with fewer than MIN_SETS_FOR_TABLE analysed sets."""
    analysis, grid = _grid(cfg, res)
    if len(cfg.student_families) < 2 or len(analysis) < MIN_SETS_FOR_TABLE:
        return []
    sets = list(analysis)
    body, spreads, best_sets = [], {}, {}
    for family, students in grid.items():
        if not students:
            body.append([family] + ["-"] * (len(sets) + 2))
            continue
        best = max(students, key=lambda label: students[label]["test_bleu"])
        best_sets[family] = best
        p_values = p_values_against(cfg, res, students, best)
        row = [family]
        for label in sets:
            r = students.get(label)
            if r is None:
                row.append("-")
            elif label == best:
                row.append(f"**{r['test_bleu']:.2f}** (best)")
            else:
                p = p_values.get(label)
                row.append(f"{r['test_bleu']:.2f} ({r['test_bleu'] - students[best]['test_bleu']:+.2f}"
                           + ("" if p is None else f", p {p:.3f}") + ")")
        row += [best, cell(analysis[best].get(X_MEASURE[0]), ".3f")]
        body.append(row)
        spreads[family] = {label: v for label, v in seed_spread(cfg, res, family).items() if v}
    parts = ["## Which training data suits which student? (test BLEU, family x training set)\n",
             table(["student"] + sets + ["best set", "its C(d) token-weighted"], body),
             "Seed-1 students, checkpoint chosen on validation BLEU, test_2016_flickr. In brackets: the difference "
             f"to the family's best set and sacrebleu's paired bootstrap p ({BOOTSTRAP_SAMPLES} resamples) against "
             "that set's student (no p where a test output is not on this machine). Families in the config's "
             "order; the sets' C(d) token-weighted: "
             + ", ".join(f"{label} {cell(analysis[label].get(X_MEASURE[0]), '.3f')}" for label in sets) + ".\n"]
    parts += _seed_spread_section(spreads)
    correlations = _correlations(analysis, grid)
    if correlations:
        families = [f for f in grid if f in correlations[0][1]]
        parts += ["### Do the data measures predict each family's student? Spearman rho (p, two-sided)\n",
                  table(["data measure"] + [f"{f} (n = {len(grid[f])})" for f in families],
                        [[label] + [f"{cell(c[f][0], '+.2f')} ({p_value_cell(c[f][1])})" for f in families]
                         for label, c in correlations]),
                  f"With {MIN_SETS_FOR_CORRELATION} sets the smallest two-sided exact p is 2/4! = 0.083: a rank order "
                  "is reported, not claimed.\n"]
    if not any(row.get(X_MEASURE[0]) is not None for row in analysis.values()):
        parts.append("No figure of BLEU against token-weighted C(d): that measure comes with the detailed analysis "
                     "(`[analysis] detailed = true`).\n")
        return parts
    paths["family_figure"] = out / "family_bleu_vs_complexity.png"
    family_figure(cfg, analysis, grid, spreads, paths["family_figure"])
    parts.append(f"![student BLEU against token-weighted C(d), one line per family]({paths['family_figure'].name})\n")
    return parts


def _correlations(analysis: dict, grid: dict) -> list[tuple[str, dict]]:
    """(measure label, family -> (rho, p)) for the families with a student on MIN_SETS_FOR_CORRELATION sets."""
    scored = {f: students for f, students in grid.items() if len(students) >= MIN_SETS_FOR_CORRELATION}
    if not scored:
        return []
    out = []
    for key, label in data_measures(list(analysis.values())):
        out.append((label, {f: spearman([measure(analysis[s], key) for s in students],
                                        [students[s]["test_bleu"] for s in students])
                            for f, students in scored.items()}))
    return out


def family_figure(cfg: StudyConfig, analysis: dict, grid: dict, spreads: dict, path: Path) -> None:
    """Test BLEU against the sets' token-weighted C(d): a line per family (the sets in order of complexity),
    each set's point in its colour and marker of the study's other figures, a vertical line over its seeds."""
    sets = list(analysis)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = ["-", "--", ":", "-."]
    for j, (family, students) in enumerate(grid.items()):
        points = sorted((analysis[s][X_MEASURE[0]], students[s]["test_bleu"], s) for s in students
                        if analysis[s].get(X_MEASURE[0]) is not None)
        if not points:
            continue
        ax.plot([x for x, _, _ in points], [y for _, y, _ in points], linestyle=styles[j % len(styles)],
                color="grey", label=family)
        for x, y, s in points:
            style = set_style(sets.index(s))
            ax.scatter(x, y, s=40, zorder=3, color=style["color"], marker=style["marker"])
            seeds = spreads.get(family, {}).get(s, [])
            if len(seeds) > 1:
                ax.vlines(x, min(seeds), max(seeds), colors=style["color"], linewidth=1.5, zorder=2)
        ax.annotate(family, (points[-1][0], points[-1][1]), textcoords="offset points", xytext=(5, 0), fontsize=8)
    for i, s in enumerate(sets):  # the sets' legend entries: colour and marker
        ax.scatter([], [], color=set_style(i)["color"], marker=set_style(i)["marker"], label=s)
    ax.set(xlabel=X_MEASURE[1], ylabel="student test BLEU", title="Which training data suits which student?")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    save_figure(fig, path)
