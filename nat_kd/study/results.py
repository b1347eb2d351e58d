"""The study's tables (Markdown), figures (PNG) and results.json, from the finished steps' records.

Everything here is re-derived from ``steps/*.json`` on every run, so the results folder always matches the
steps that are done; missing pieces (a step not run yet) show as '-'.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from nat_kd import atomic
from nat_kd.machine import hardware
from nat_kd.markdown import cell, table
from nat_kd.analysis.metrics import shown
from nat_kd.analysis.metrics.base import DECODING
from nat_kd.analysis.plotting import (legend_outside, plot_complexity_faithfulness, plot_mode_mix, plt, save_figure,
                                      scatter_sets, set_style)

from fairseq_plugins.models.nat import STUDENT_FAMILIES

from .config import StudyConfig
from nat_kd.engine.steps import student_step
from .central_table import central_section
from .family_table import family_section
from .ladder import ladder_section
from .plan import ANALYSIS, analysis_result
from .gains import gains_section
from .kd_methods import kd_methods_section


def teachers_table(cfg: StudyConfig, res: dict) -> str:
    rows = []
    for t in cfg.teachers:
        r = res.get(f"teacher.{t.name}", {})
        rows.append([t.name, t.shape.label, f"{t.shape.ffn_dim}", cell(r.get("parameters"), ","),
                     cell(r.get("valid_bleu"), ".2f"), cell(r.get("test_bleu"), ".2f")])
    return table(["teacher", "layers x dim", "ffn", "parameters", "valid BLEU", "test BLEU"], rows)


def decoding_table(cfg: StudyConfig, res: dict) -> str:
    analysis = {row["name"]: row for row in res.get("analysis", {}).get("rows", [])}
    teachers = {d.name: d.teacher for d in cfg.distilled}
    mixes = []
    for m in cfg.mixes:
        made = res.get(f"mix.{m.name}", {})
        if m.selective_kd:  # its targets are chosen during training
            accuracy = made.get("mean_accuracy")
            mixes.append((m.name, teachers[m.of], f"Selective KD of {m.of}" + (
                "" if accuracy is None else f" (the evaluator's mean accuracy {accuracy:.3f})")))
            continue
        replaced = made.get("replaced")
        mixes.append((m.name, teachers[m.of], f"mix of {m.of}" + ("" if replaced is None else
                                                               f" ({replaced:,} lines replaced)")))
    several = [(r.name, ", ".join(dict.fromkeys(teachers[s] for s in r.of)), r.description()) for r in cfg.references]
    rows, columns = [], shown(DECODING)
    for name, teacher, strategy in ([("real", "-", "reference")] + [(d.name, d.teacher, d.strategy)
                                                                    for d in cfg.distilled] + mixes + several):
        a, d = analysis.get(name, {}), res.get(f"distil.{name}", {})
        rows.append([name, teacher, strategy, *(cell(a.get(m.name), column.format) for m, column in columns),
                     cell(d.get("sentences_per_second"), ".1f")])
    return table(["training set", "teacher", "decoding", *(column.label for _, column in columns), "distil sent/s"],
                 rows)


def data_labels(cfg: StudyConfig) -> list[str]:
    return cfg.data_labels()


def students_table(cfg: StudyConfig, res: dict) -> str:
    rows = []
    for data in data_labels(cfg):
        rows.append([data] + [cell(res.get(f"student.{f}.{data}", {}).get("test_bleu"), ".2f")
                              for f in cfg.student_families])
    return table(["training data"] + [f"{f} test BLEU" for f in cfg.student_families], rows)


def born_again_table(cfg: StudyConfig, res: dict) -> str:
    family = cfg.born_again_student
    rows = [[0, "real data", "-", "-", cell(res.get(f"student.{family}.real", {}).get("test_bleu"), ".2f")]]
    for r in range(1, cfg.born_again_rounds + 1):
        at, data = res.get(f"born_again.{r}.at", {}), res.get(f"born_again.{r}.distil", {})
        rows.append([r, "real data" if r == 1 else f"round {r - 1}'s distilled data", cell(at.get("test_bleu"), ".2f"),
                     cell(data.get("bleu_vs_reference"), ".2f"),
                     cell(res.get(f"born_again.{r}.student", {}).get("test_bleu"), ".2f")])
    return table(["round", "AT trained on", "AT test BLEU", "round's data BLEU vs real",
                   f"{family} test BLEU on it"], rows)


def modes_table(res: dict) -> str:
    m = res.get("modes.analysis")
    if not m:
        return "(not run)\n"
    langs = m["languages"]
    rows = [[r["name"], cell(r.get("test_bleu"), ".2f"), cell(r["mode_purity"], ".3f")]
            + [cell(r["mode_mix"][lang], ".3f") for lang in langs]
            + [cell(r["argmax_share"][lang], ".3f") for lang in langs]
            for r in m["rows"]]
    return table(["outputs", "test BLEU (mixed refs)", "purity"] + [f"p({lang} \\| y)" for lang in langs]
                  + [f"argmax {lang}" for lang in langs], rows)


def capacity_figure(cfg: StudyConfig, res: dict, path: Path) -> bool:
    """Left: teacher BLEU by capacity. Right: each student's BLEU on its beam-distilled data, against the
    capacity of the teacher that made the data; dashed: the same student on the real data. Teachers of one
    shape differ in their training only, so then the x axis is their test BLEU instead. Nothing is drawn
    (False) for fewer than two trained teachers with a beam set: a single point shows no trend (a study
    under way draws those trained so far)."""
    beam = {d.teacher: d.name for d in cfg.distilled if d.strategy == "beam"}
    teachers = [t for t in cfg.teachers if t.name in beam and res.get(f"teacher.{t.name}", {}).get("test_bleu")
                is not None]
    if len(teachers) < 2:
        return False
    params = [res.get(f"teacher.{t.name}", {}).get("parameters") for t in teachers]
    bleu_of = [res.get(f"teacher.{t.name}", {}).get("test_bleu") for t in teachers]
    by_size = len({t.shape for t in teachers}) == len(teachers)
    # teachers of one shape differ in how long they trained: the checkpoint's updates
    updates = [res.get(f"teacher.{t.name}", {}).get("best_updates", t.training.updates) for t in teachers]
    x_left, x = (params, params) if by_size else (updates, bleu_of)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(x_left, bleu_of, "o-", color="black")
    for t, xi, yi in zip(teachers, x_left, bleu_of):
        left.annotate(t.name, (xi or 0, yi or 0), textcoords="offset points", xytext=(4, 4), fontsize=8)
    xlabel = "teacher parameters" if by_size else "updates of the teacher's checkpoint (the teachers share one shape)"
    left.set(xscale="log" if by_size else "linear", xlabel=xlabel, ylabel="test BLEU", title="AT teachers")
    for i, family in enumerate(cfg.student_families):
        color = f"C{i}"
        bleu = [res.get(f"student.{family}.{beam[t.name]}", {}).get("test_bleu") for t in teachers]
        right.plot(x, bleu, "o-", color=color, label=f"{family}, distilled")
        real = res.get(f"student.{family}.real", {}).get("test_bleu")
        if real is not None:
            right.axhline(real, color=color, linestyle="--", label=f"{family}, real data")
    right.set(xscale="log" if by_size else "linear",
              xlabel=("capacity of the teacher that distilled the data (parameters)" if by_size
                      else "test BLEU of the teacher that distilled the data"),
              ylabel="student test BLEU", title="NAT students vs teacher " + ("capacity" if by_size else "quality"))
    if by_size:  # the teachers' span, also while no student on their sets has a BLEU (log axes need one)
        right.set_xlim(left.get_xlim())
    for ax in (left, right):
        ax.grid(alpha=0.3)
    right.legend(fontsize=8)
    save_figure(fig, path)
    return True


def born_again_figure(cfg: StudyConfig, res: dict, path: Path) -> None:
    rounds = list(range(0, cfg.born_again_rounds + 1))
    family = cfg.born_again_student
    nat = [res.get(f"student.{family}.real" if r == 0 else f"born_again.{r}.student", {}).get("test_bleu")
           for r in rounds]
    at = [None] + [res.get(f"born_again.{r}.at", {}).get("test_bleu") for r in rounds[1:]]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(rounds, [float("nan") if v is None else v for v in nat], "o-", label=f"{family} student")
    ax.plot(rounds, [float("nan") if v is None else v for v in at], "s--", label="student-sized AT")
    ax.set(xlabel="Born-Again round (0: real data)", ylabel="test BLEU", title="Born-Again rounds")
    ax.set_xticks(rounds)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def bleu_signatures(res: dict) -> str:
    """sacrebleu's signature of the BLEU figures above (one, unless the records come from different versions)."""
    signatures = sorted({r["bleu_signature"] for r in res.values() if r.get("bleu_signature")})
    return "".join(f"BLEU signature: `{s}`\n" for s in signatures)


def trained_models(cfg: StudyConfig) -> list[tuple[str, str]]:
    """(step, label) of every teacher and student, in plan order."""
    extra = [f for f in (cfg.speed.students if cfg.speed else ()) if f not in cfg.student_families]
    return ([(f"teacher.{t.name}", f"teacher {t.name}") for t in cfg.teachers]
            + [(student_step(f, d), f"{f} on {d}") for f in cfg.student_families for d in data_labels(cfg)]
            + [(student_step(f, d, seed), f"{f} on {d}, seed {seed}") for seed in cfg.student_seeds
               for f, labels in cfg.seed_sets.items() for d in labels]
            + [(student_step(f, cfg.speed.data), f"{f} on {cfg.speed.data}") for f in extra])


def curves_table(cfg: StudyConfig, res: dict) -> str:
    """Each model trained with a validation-BLEU curve: where it peaked, how far it trained, test BLEU there."""
    rows = []
    for step, label in trained_models(cfg):
        r = res.get(step, {})
        if "curve" not in r:
            continue
        rows.append([label, cell(r["valid_bleu"], ".2f"), r["best_updates"], r["updates_trained"],
                     "yes" if r["stopped_early"] else "no", cell(r.get("test_bleu"), ".2f"),
                     cell(sum(p["train_seconds"] for p in r["curve"]) / 60, ".1f")])
    return table(["model", "best valid BLEU", "at update", "updates trained", "stopped early", "test BLEU there",
                   "training min"], rows) if rows else "(no model trained with a validation-BLEU curve yet)\n"


def curves_figure(cfg: StudyConfig, res: dict, path: Path) -> None:
    """Validation BLEU against updates. Left: the teachers. Right: one curve per student and training set
    (colour and marker: the training data, as in the study's other figures; line style: the family)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, t in enumerate(cfg.teachers):
        curve = res.get(f"teacher.{t.name}", {}).get("curve")
        if curve:
            left.plot([p["updates"] for p in curve], [p["valid_bleu"] for p in curve], "o-", color=f"C{i}",
                      label=f"teacher {t.name}")
        elif res.get(f"teacher.{t.name}", {}).get("valid_bleu") is not None:
            left.plot([t.training.updates], [res[f"teacher.{t.name}"]["valid_bleu"]], "s", color=f"C{i}",
                      label=f"teacher {t.name} (no curve)")
    styles = ["-", "--", ":", "-."]
    for j, family in enumerate(cfg.student_families):
        for i, data in enumerate(data_labels(cfg)):
            curve = res.get(f"student.{family}.{data}", {}).get("curve")
            if curve:
                right.plot([p["updates"] for p in curve], [p["valid_bleu"] for p in curve], markersize=4,
                           linestyle=styles[j % len(styles)], label=f"{family} on {data}", **set_style(i))
    left.set(xlabel="updates", ylabel="validation BLEU", title="AT teachers")
    right.set(xlabel="updates", ylabel="validation BLEU", title="NAT students")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    if left.get_legend_handles_labels()[0]:
        left.legend(fontsize=8)
    if right.get_legend_handles_labels()[0]:  # a curve per student and set: outside, where it hides none
        legend_outside(right)
    save_figure(fig, path)


def _analysis_rows(cfg: StudyConfig, res: dict) -> list[dict]:
    rows = {row["name"]: row for row in res.get("analysis", {}).get("rows", [])}
    return [rows[name] for name in data_labels(cfg) if name in rows]


def detailed_tables(cfg: StudyConfig, res: dict) -> str:
    """The detailed analysis: C(d) by source frequency and token-weighted, F(d) by floor and interpolated,
    and the targets' surface (types, repeated n-grams); '' when the analysis has no detailed measures."""
    rows = [r for r in _analysis_rows(cfg, res) if "complexity_buckets" in r]
    if not rows:
        return ""
    buckets = [f"C(d) {b['bucket']} ({b['words']} words)" for b in rows[0]["complexity_buckets"]]
    complexity = table(["training set", "C(d) paper (mean over types)", "C(d) token-weighted"] + buckets,
                        [[r["name"], cell(r["complexity"], ".3f"), cell(r["complexity_token_weighted"], ".3f")]
                         + [cell(b["complexity"], ".3f") for b in r["complexity_buckets"]] for r in rows])
    floors = list(rows[0]["faithfulness_floors"])
    faithfulness = table(["training set"] + [f"F(d) floor {f}" for f in floors]
                          + ["real mass missing", f"F(d) interpolated ({cfg.analysis['interpolation']})"],
                          [[r["name"]] + [cell(r["faithfulness_floors"][f], ".3f") for f in floors]
                           + [cell(r["missing_mass"], ".3f"), cell(r["faithfulness_interpolated"], ".3f")]
                           for r in rows])
    ns = list(rows[0]["repeated_ngram_share"])
    surface = table(["training set", "BLEU vs real", "target types", "target tokens"]
                     + [f"share with a repeated {n}-gram" for n in ns] + ["FRS"],
                     [[r["name"], cell(r["bleu"], ".2f"), r["types"], r["tokens"]]
                      + [cell(r["repeated_ngram_share"][n], ".3f") for n in ns] + [cell(r["reordering"], ".4f")]
                      for r in rows])
    signature = res["analysis"]["signature"]
    return "\n".join([
        "### Complexity C(d) by source-word frequency in the real data (nats)\n", complexity,
        "### Faithfulness F(d) against the smoothing (nats)\n", faithfulness,
        "### The targets' surface\n", surface,
        "Signatures: " + "; ".join(f"{k}: `{v}`" for k, v in signature.items()) + "\n"])


def analysis_figure(cfg: StudyConfig, res: dict, path: Path) -> None:
    """Left: C(d) against F(d) as the paper defines them. Middle: token-weighted C(d) against the
    interpolated F(d). Right: C(d) within each source-frequency bucket, one line per training set."""
    rows = [r for r in _analysis_rows(cfg, res) if "complexity_buckets" in r]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, (cx, fx, title) in zip(axes, [("complexity", "faithfulness", "as in the paper (floor 1e-9)"),
                                          ("complexity_token_weighted", "faithfulness_interpolated",
                                           "token-weighted C(d), interpolated F(d)")]):
        scatter_sets(ax, [(r["name"], r[cx], r[fx]) for r in rows])
        ax.set(xlabel="complexity C(d) [nats]", ylabel="faithfulness F(d) [nats]", title=title)
        ax.margins(0.1)
        ax.grid(alpha=0.3)
    right = axes[2]
    for i, r in enumerate(rows):  # each set in its colour and marker of the left panels
        labels = [b["bucket"] for b in r["complexity_buckets"]]
        right.plot(labels, [b["complexity"] for b in r["complexity_buckets"]], "-", label=r["name"],
                   **set_style(i))
    right.set(xlabel="source word's count in the real data", ylabel="C(d) within the bucket [nats]",
              title="complexity by source-word frequency")
    right.grid(alpha=0.3)
    if rows:
        legend_outside(right)
    save_figure(fig, path)


def _corpus_line(cfg: StudyConfig) -> str:
    if cfg.corpus is None:
        limit = f", first {cfg.train_limit} training pairs" if cfg.train_limit else ""
        return f"Multi30k {cfg.src}-{cfg.tgt}{limit}"
    return f"{cfg.src}-{cfg.tgt}, " + ", ".join(f"{key} `{value}`" for key, value in cfg.corpus.items())


def _hardware_line(records) -> str:
    """Where the steps ran, from their records (a study resumed on other machines ran on several), and the
    machine that rendered the page."""
    machines: dict[str, int] = {}
    unrecorded = 0
    for record in records:
        if "hardware" not in record:
            unrecorded += 1
            continue
        hw = record["hardware"]
        name = f"{hw['cpu']}, {hw['cores']} core{'s' if hw['cores'] > 1 else ''}" + (
            f", {hw['gpu']}" if hw.get("gpu") and str(record.get("device")).startswith("cuda") else "")
        machines[name] = machines.get(name, 0) + 1
    ran = [f"{name}: {count} step{'s' if count > 1 else ''}"
           for name, count in sorted(machines.items(), key=lambda item: -item[1])]
    if unrecorded:
        ran.append("not named (records written before they named it): "
                   f"{unrecorded} step{'s' if unrecorded > 1 else ''}")
    return f"steps by machine: {'; '.join(ran) or 'none run'}; rendered on {json.dumps(hardware())}"


def _layout(records) -> str:
    """How the steps ran, from their records: a study may be resumed with other --jobs or --threads, and a
    step run as a cluster job names its launcher and resources instead."""
    records = list(records)
    jobs = [r for r in records if "launcher" in r]
    if jobs:
        kinds = sorted({r["launcher"]["launcher"] for r in jobs})
        return (f"{len(jobs)} of {len(records)} steps ran as {' and '.join(kinds)} jobs, each with the resources "
                "its record names; the rest in the driver's process")
    layouts = {(r.get("jobs"), r.get("threads")) for r in records}
    if len(layouts) == 1 and None not in (layout := layouts.pop()):
        jobs, threads = layout
        return f"steps ran {jobs} at a time, {threads} torch thread{'s' if threads > 1 else ''} each"
    return "steps ran with the layouts in the step wall-time table; '-' where a record predates them"


def speed_section(cfg: StudyConfig, res: dict) -> list[str]:
    """Speed against quality: each system's median sentences/s over the rounds, its speedup over the first
    system (the teacher's beam search) as the median of the per-round ratios, and the BLEU of its output."""
    speed = res.get("speed")
    if not cfg.speed:
        return []
    if not speed:
        return ["## Speed against quality (test set, one thread)\n", "(not run yet)\n"]
    import statistics

    rows = []
    for label in speed["systems"]:
        for batching in cfg.speed.batchings:
            runs = [r["sentences_per_second"] for r in speed["runs"]
                    if r["system"] == label and r["batching"] == batching]
            rows.append([label, batching.replace("sentences:", "batch size ").replace("tokens:", "max tokens "),
                         cell(statistics.median(runs) if runs else None, ".1f"),
                         cell(speed["speedup"].get(f"{label}|{batching}"), ".2f"),
                         cell(speed["bleu"].get(f"{label}|{batching}"), ".2f")])
    return ["## Speed against quality (test set, one thread)\n",
            table(["system", "batching", "sentences/s (median)", f"speedup over {speed['baseline']}", "test BLEU"],
                  rows),
            f"{cfg.speed.repeats} rounds; within a round every system decodes the whole test set once per batching, "
            "in turn (in reverse order every other round). Speed is fairseq-generate's own count (time spent "
            "generating; loading excluded); a speedup is the median of the per-round ratios. The students decode in "
            + ", ".join(f"{f}: {' '.join(STUDENT_FAMILIES[f].decode_flags)}" for f in cfg.speed.students) + ".\n"]


def training_speed_section(cfg: StudyConfig, res: dict) -> list[str]:
    """Each family's updates/s in training, by round, and its ratio to the first family (the median of the
    per-round ratios)."""
    if not cfg.training_speed:
        return []
    title = "## Training speed (updates/s from scratch, one thread)\n"
    speed = res.get("training_speed")
    if not speed:
        return [title, "(not run yet)\n"]
    import statistics

    rows = []
    for family in speed["families"]:
        rates = [r["updates_per_second"] for r in speed["runs"] if r["family"] == family]
        rows.append([family, ", ".join(f"{x:.2f}" for x in rates), cell(statistics.median(rates), ".2f"),
                     cell(speed["ratio"][family], ".2f")])
    ts = cfg.training_speed
    return [title, table(["student", "updates/s by round", "median", f"ratio to {speed['baseline']}"], rows),
            f"Each run trains the student from scratch for {speed['updates']} updates on {ts.data} with "
            f"[students.training]'s batches, nothing saved or validated; its speed is the median of fairseq-train's "
            "own updates/s reports, the first (start-up) left out. The families take turns within a round, in "
            f"reverse order every other round, {ts.repeats} round(s); a ratio is taken within a round, the median "
            "reported.\n"]


def _shown_path(path) -> str:
    """A path as the results show it: relative to the repository when inside it, not the machine's absolute one."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return Path(path).name


def _figures(cfg: StudyConfig, res: dict, out: Path) -> dict[str, Path]:
    """The figures that stand apart from the tables (teacher capacity, the mode mix, Born-Again rounds, the
    learning curves, the analysis's C(d) against F(d)): drawn where their steps have run."""
    paths = {}
    if capacity_figure(cfg, res, out / "students_vs_teacher_capacity.png"):
        paths["capacity_figure"] = out / "students_vs_teacher_capacity.png"
    if res.get("modes.analysis"):
        paths["modes_figure"] = out / "modes" / "mode_mix.png"
        plot_mode_mix(res["modes.analysis"]["rows"], res["modes.analysis"]["languages"], paths["modes_figure"])
    if cfg.born_again_rounds:
        paths["born_again_figure"] = out / "born_again.png"
        born_again_figure(cfg, res, paths["born_again_figure"])
    if any("curve" in res.get(step, {}) for step, _ in trained_models(cfg)):
        paths["curves_figure"] = out / "validation_bleu_curves.png"
        curves_figure(cfg, res, paths["curves_figure"])
    if _analysis_rows(cfg, res):  # drawn by the analysis step too; redrawn so that it has today's style
        plot_complexity_faithfulness(_analysis_rows(cfg, res), out / "analysis" / "complexity_vs_faithfulness.png")
    return paths


def _header(cfg: StudyConfig, records: dict, command: str, pending: dict[str, str]) -> list[str]:
    walls = sorted((r["wall_seconds"] for r in records.values()), reverse=True)  # summed as the table lists them
    return [
        f"# Distillation study: profile `{cfg.name}`\n",
        f"Command: `{command}`  \nConfig: [`config.toml`](config.toml) (copied from `{_shown_path(cfg.source)}`).  \n"
        f"Corpus: {_corpus_line(cfg)}.  \n"
        f"Hardware: {_hardware_line(records.values())}.  \n"
        f"Total step time: {sum(walls) / 60:.1f} min over {len(walls)} steps "
        f"({_layout(records.values())}).\n",
        *([f"**Partial results**: {len(records)} of {len(records) + len(pending)} steps done; still to run: "
           + ", ".join(f"`{name}`" + (f" ({note})" if note else "") for name, note in pending.items())
           + ".\n"] if pending else [])]


def _wall_times(records: dict) -> list[str]:
    walls = sorted(((r["wall_seconds"], n) for n, r in records.items()), reverse=True)
    return ["## Step wall times\n",
            "A resumed step's wall time is that of all its runs ('-' runs: a record written before they were "
            "counted, whose time is its last run's).\n",
            table(["step", "wall (s)", "runs", "steps at a time", "torch threads"],
                  [[n, f"{w:.0f}", records[n].get("runs", "-"), records[n].get("jobs", "-"),
                    records[n].get("threads", "-")] for w, n in walls])]


def write_results(cfg: StudyConfig, records: dict, out: Path, command: str,
                  pending: dict[str, str] | None = None) -> dict[str, Path]:
    """``pending``: the plan's steps not done yet (a study rendered mid-run), each with a note on how far it
    got ('' if none); named under the header, their cells are '-'."""
    out.mkdir(parents=True, exist_ok=True)
    res = {name: rec["result"] for name, rec in records.items()}
    analysis = analysis_result(res)
    if analysis:
        res[ANALYSIS] = analysis
    paths = _figures(cfg, res, out)
    details = detailed_tables(cfg, res)
    if details:
        paths["analysis_figure"] = out / "complexity_faithfulness_detailed.png"
        analysis_figure(cfg, res, paths["analysis_figure"])
    sections = [
        *_header(cfg, records, command, pending or {}),
        "## 1. Teachers\n", teachers_table(cfg, res),
        "## 2. Distilled training sets (analysis of the training targets)\n", decoding_table(cfg, res),
        "![complexity vs faithfulness](analysis/complexity_vs_faithfulness.png)\n",
        *([details, f"![detailed analysis]({paths['analysis_figure'].name})\n"] if details else []),
        "## 3. NAT students (test BLEU, sacrebleu on detokenized output; checkpoint chosen on "
        + ("validation BLEU" if cfg.student_training.bleu_every else "valid loss") + ")\n",
        students_table(cfg, res), bleu_signatures(res),
        *([f"![students vs teacher capacity]({paths['capacity_figure'].name})\n"]
          if "capacity_figure" in paths else []),
        *gains_section(cfg, res),
        *kd_methods_section(cfg, res),
        *central_section(cfg, res, out, paths),
        *family_section(cfg, res, out, paths),
        *ladder_section(cfg, res, out, paths),
        *speed_section(cfg, res),
        *training_speed_section(cfg, res),
        *(["## Learning curves (validation BLEU every N updates; the checkpoint kept is the best)\n",
           curves_table(cfg, res), f"![validation BLEU against updates]({paths['curves_figure'].name})\n"]
          if "curves_figure" in paths else []),
        *(["## 4. Born-Again rounds\n", born_again_table(cfg, res), "![born-again](born_again.png)\n"]
          if cfg.born_again_rounds else []),
        *(["## 5. Multi-modality (untagged en -> de/fr/cs)\n", modes_table(res), "![mode mix](modes/mode_mix.png)\n"]
          if cfg.modes else []),
        *_wall_times(records),
    ]
    paths["markdown"] = out / "results.md"
    atomic.write_text(paths["markdown"], "\n".join(sections))
    paths["json"] = out / "results.json"
    atomic.write_json(paths["json"], {"profile": cfg.name, "command": command, "hardware": hardware(),
                                      "steps": records})
    if cfg.source and Path(cfg.source).resolve() != (out / "config.toml").resolve():
        shutil.copyfile(cfg.source, out / "config.toml")
    return paths
