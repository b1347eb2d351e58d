"""The paper's central figure (Zhou, Gu & Neubig, ICLR 2020, Figure 3): NAT students of rising capacity, each
trained on the beam sets of AT teachers of rising size, and the two things the paper reads from it:

- every student's curve first rises and then falls as the teacher grows;
- the weaker the student, the simpler the data of its peak; the stronger, the more complex.

Drawn for a study whose teachers differ in size (a ladder: LADDER_RUNGS or more, each with a beam set) and whose
student families learned from them; the families are taken in the config's order, weakest first. From the step
records only, like the rest of the results; each family's seed spread (pooled sd) says which differences are
within the noise.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from nat_kd.analysis.plotting import legend_outside, plt, save_figure
from nat_kd.markdown import cell, table

from .central_table import BOOTSTRAP_SAMPLES, p_value_cell, p_values_against, pooled_sd, seed_spread, spearman
from .config import StudyConfig
from nat_kd.engine.steps import student_step

LADDER_RUNGS = 2  # teachers of distinct sizes with a beam set; a curve can rise and fall over three or more
COMPLEXITY = (("complexity", "C(d) paper"), ("complexity_token_weighted", "C(d) token-weighted"))


def rungs(cfg: StudyConfig, res: dict) -> list[dict]:
    """The teachers of distinct shapes that made a beam set, smallest first (by their parameters, else the
    config's order): name, set label, parameters, test BLEU, and the set's C(d) in both forms."""
    analysis = {row["name"]: row for row in res.get("analysis", {}).get("rows", [])}
    beam = {d.teacher: d.name for d in cfg.distilled if d.strategy == "beam"}
    teachers = [t for t in cfg.teachers if t.name in beam]
    if len({t.shape for t in teachers}) != len(teachers):
        return []  # teachers of one shape differ in training, not in size: not a ladder
    out = []
    for i, t in enumerate(teachers):
        record, row = res.get(f"teacher.{t.name}", {}), analysis.get(beam[t.name], {})
        out.append({"teacher": t.name, "set": beam[t.name], "shape": t.shape.label, "order": i,
                    "parameters": record.get("parameters"), "test_bleu": record.get("test_bleu"),
                    **{key: row.get(key) for key, _ in COMPLEXITY}})
    return sorted(out, key=lambda r: (r["parameters"] is None, r["parameters"] or 0, r["order"]))


def _curves(cfg: StudyConfig, res: dict, ladder: list[dict]) -> dict[str, list[float | None]]:
    """family -> its seed-1 students' test BLEU on each rung's set, for the families on LADDER_RUNGS or more."""
    curves = {}
    for family in cfg.student_families:
        bleu = [res.get(student_step(family, r["set"]), {}).get("test_bleu") for r in ladder]
        if sum(b is not None for b in bleu) >= LADDER_RUNGS:
            curves[family] = bleu
    return curves


def _shape_of_curve(bleu: list[float | None], noise: float | None) -> tuple[int, str]:
    """The peak's rung, and the curve's shape in words: rises then falls (a peak between the ends, below it on
    both sides), or only rises or falls; with ``noise`` (2 sd of a difference between two students) each side's
    drop says whether it is beyond the seeds' spread."""
    points = [(i, b) for i, b in enumerate(bleu) if b is not None]
    peak = max(points, key=lambda p: p[1])[0]  # the first of equal highs: the smaller teacher
    first, last = points[0], points[-1]
    if len({b for _, b in points}) == 1:
        return peak, f"is flat: {first[1]:.2f} on every teacher's set"
    if peak in (first[0], last[0]):
        words = "falls from the smallest teacher on" if peak == first[0] else "rises to the largest teacher"
        neighbour = points[1] if peak == first[0] else points[-2]
        lead = bleu[peak] - neighbour[1]
        beyond = "" if noise is None else (f"; its lead over the next rung, +{lead:.2f}, "
                                           f"{'beyond' if lead > noise else 'within'} 2 seed sd of a difference "
                                           f"({noise:.2f})")
        return peak, words + beyond
    left, right = bleu[peak] - first[1], bleu[peak] - last[1]
    beyond = "" if noise is None else (f"; beyond 2 seed sd of a difference ({noise:.2f}) on "
                                       + {(True, True): "both sides", (True, False): "the rising side only",
                                          (False, True): "the falling side only", (False, False): "neither side"}
                                       [(left > noise, right > noise)])
    return peak, f"rises then falls: +{left:.2f} from the smallest teacher, -{right:.2f} to the largest{beyond}"


def _seed_means(ladder: list[dict], spread: dict[str, list[float]]) -> str:
    """A family's mean test BLEU over its seeds on each rung with two or more (``spread``: set -> the seeds'),
    where two rungs have them: the shape a single seed draws can be the seed's."""
    means = [(r["teacher"], statistics.mean(spread[r["set"]]), len(spread[r["set"]])) for r in ladder
             if r["set"] in spread]
    if len(means) < 2:
        return ""
    best = max(means, key=lambda m: m[1])[0]
    return ("; the means of its seeds: " + ", ".join(f"{t} {m:.2f} ({n})" for t, m, n in means)
            + f", the highest of them on {best}")


def ladder_section(cfg: StudyConfig, res: dict, out: Path, paths: dict) -> list[str]:
    """Markdown parts; [] without a ladder of LADDER_RUNGS teachers of distinct sizes that a family learned
    from."""
    ladder = rungs(cfg, res)
    if len(ladder) < LADDER_RUNGS:
        return []
    curves = _curves(cfg, res, ladder)
    if not curves:
        return []
    paths["ladder_figure"] = out / "students_vs_teacher_size.png"
    ladder_figure(cfg, res, ladder, curves, paths["ladder_figure"])
    header = ["student"] + [f"{r['teacher']} ({r['shape']})" for r in ladder] + ["real data", "peak"]
    rows, peaks = [], {}
    for family, bleu in curves.items():
        spread = {label: v for label, v in seed_spread(cfg, res, family).items() if len(v) > 1}
        sd = pooled_sd(spread)
        peak, words = _shape_of_curve(bleu, 2 * sd * 2 ** 0.5 if sd else None)
        peaks[family] = (peak, words + _seed_means(ladder, spread), sd)
        students = {r["set"]: res[student_step(family, r["set"])] for r, b in zip(ladder, bleu) if b is not None}
        p = p_values_against(cfg, res, students, ladder[peak]["set"])
        cells = [("**" + cell(b, ".2f") + "**") if i == peak else cell(b, ".2f")
                 + (f" (p {p_value_cell(p[ladder[i]['set']])})" if ladder[i]["set"] in p else "")
                 for i, b in enumerate(bleu)]
        real = res.get(student_step(family, "real"), {}).get("test_bleu")
        rows.append([family, *cells, cell(real, ".2f"), ladder[peak]["teacher"]])
    teacher_row = ["teacher's own test BLEU", *[cell(r["test_bleu"], ".2f") for r in ladder], "", ""]
    measure_rows = [[label, *[cell(r[key], ".3f") for r in ladder], "", ""] for key, label in COMPLEXITY]
    parts = ["## The central figure: students on the beam sets of teachers of rising size\n",
             f"![students against the teacher's size]({paths['ladder_figure'].name})\n",
             table(header, [teacher_row, *measure_rows, *rows]),
             "Seed-1 students' test BLEU on each teacher's beam set (bold: the family's peak; p: sacrebleu's "
             f"paired bootstrap, {BOOTSTRAP_SAMPLES} resamples, of that cell's test output against the peak's); "
             "the teachers from the smallest up, the families in the config's order (weakest first).\n",
             "**Does every curve rise, then fall?**\n",
             "".join(f"- {family}: {words}" + ("" if sd is None else f" (pooled seed sd {sd:.2f})") + ".\n"
                     for family, (_, words, sd) in peaks.items()),
             "**Does the peak's complexity rise with the student's strength?**\n"]
    verdicts = []
    for key, label in COMPLEXITY:
        values = [ladder[peaks[f][0]][key] for f in curves]
        if any(v is None for v in values):
            continue
        shown = ", ".join(f"{f} {ladder[peaks[f][0]]['teacher']} ({v:.3f})" for f, v in zip(curves, values))
        rising = all(b >= a for a, b in zip(values, values[1:])) and values[-1] > values[0]
        rho = (f"; Spearman rho {spearman(list(range(len(values))), values)[0]:+.2f} over {len(values)} families"
               if len(values) >= 3 and len(set(values)) > 1 else "")
        verdicts.append(f"- {label} of each family's peak set, weakest first: {shown}: "
                        f"{'rises' if rising else 'does not rise'} with the student's strength{rho}.\n")
    # a peak on the largest teacher a family has, with larger ones on the ladder not measured, may move up
    open_ended = [f for f, bleu in curves.items() if peaks[f][0] == max(i for i, b in enumerate(bleu) if b is not None)
                  and any(b is None for b in bleu[peaks[f][0] + 1:])]
    if verdicts and open_ended:
        verdicts.append(f"- {', '.join(open_ended)}: the peak is the largest teacher's set with a student, and the "
                        "larger teachers' are not measured yet: the peak may lie further up the ladder.\n")
    return [*parts, "".join(verdicts), *_not_yet(cfg, res, ladder, curves)]


def _not_yet(cfg: StudyConfig, res: dict, ladder: list[dict], curves: dict) -> list[str]:
    """A line naming each rung no family has a student on yet (with the first step it waits for), each family
    whose curve is not drawn, and each drawn family's missing rungs, so that a figure drawn before the ladder is
    whole says what it lacks."""
    lines = []
    for i, r in enumerate(ladder):
        if any(bleu[i] is not None for bleu in curves.values()):
            continue
        waits = ("its teacher has not finished training" if f"teacher.{r['teacher']}" not in res
                 else "its beam set has not been made" if f"distil.{r['set']}" not in res
                 else "no student has trained on its beam set")
        lines.append(f"- {r['teacher']} ({r['shape']}): {waits}.\n")
    drawn = [i for i, r in enumerate(ladder) if any(bleu[i] is not None for bleu in curves.values())]
    for family in cfg.student_families:
        bleu = curves.get(family) or [res.get(student_step(family, r["set"]), {}).get("test_bleu") for r in ladder]
        if family not in curves:
            lines.append(f"- {family}: a student on {sum(b is not None for b in bleu)} of the {len(ladder)} "
                         f"teachers' sets, its curve drawn from {LADDER_RUNGS}.\n")
        elif missing := [ladder[i] for i in drawn if bleu[i] is None]:
            lines.append(f"- {family}: no student yet on the set of "
                         + ", ".join(f"{r['teacher']} ({r['shape']})" for r in missing) + ".\n")
    return ["**Not yet on the ladder** (the verdicts above are read without them):\n", "".join(lines)] if lines else []


def ladder_figure(cfg: StudyConfig, res: dict, ladder: list[dict], curves: dict, path: Path) -> None:
    """The paper's form: the teachers on the x axis, smallest first, each tick naming its size and its set's
    C(d); left, the teachers' own test BLEU; right, one line per student family on the teachers' sets, its
    real-data student dashed, a vertical bar over the seeds where there are several."""
    x = list(range(len(ladder)))
    ticks = [f"{r['teacher']} {r['shape']}\n{_millions(r['parameters'])}\nC {cell(r['complexity'], '.3f')}"
             + (f" | {r['complexity_token_weighted']:.3f}" if r["complexity_token_weighted"] is not None else "")
             for r in ladder]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1, 2]})
    left.plot(x, [r["test_bleu"] for r in ladder], "s-", color="black")
    left.set(ylabel="teacher test BLEU", title="AT teachers")
    for j, (family, bleu) in enumerate(curves.items()):
        color = f"C{j}"
        right.plot([i for i, b in enumerate(bleu) if b is not None], [b for b in bleu if b is not None], "o-",
                   color=color, label=family)
        for i, r in enumerate(ladder):
            seeds = seed_spread(cfg, res, family).get(r["set"], [])
            if len(seeds) > 1:
                right.vlines(i, min(seeds), max(seeds), colors=color, linewidth=1.5)
                right.scatter([i], [statistics.mean(seeds)], marker="_", color=color, s=80)
        real = res.get(student_step(family, "real"), {}).get("test_bleu")
        if real is not None:
            right.axhline(real, color=color, linestyle="--", linewidth=1, label=f"{family}, real data")
    right.set(ylabel="student test BLEU", title="NAT students on each teacher's beam set")
    for ax in (left, right):
        ax.set_xticks(x)
        ax.set_xticklabels(ticks, fontsize=7)
        ax.set_xlabel("teacher (parameters; its set's C(d): paper | token-weighted)")
        ax.grid(alpha=0.3)
    legend_outside(right)
    save_figure(fig, path)


def _millions(parameters: int | None) -> str:
    return "-" if parameters is None else f"{parameters / 1e6:.1f}M params"
