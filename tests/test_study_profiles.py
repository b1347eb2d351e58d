"""The study driver end to end: bundled profiles in miniature run on the first Multi30k lines, resumed, their
results checked table by table. In files of their own so that the test workers run them side by side."""
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_profile, small_multi30k
from nat_kd.study import config as study_config
from nat_kd.study.plan import build_plan


# ------------------------------------------------------------------ micro profile, end to end


@pytest.mark.slow
def test_micro_profile_end_to_end_and_resumes(tmp_path, capsys):
    from nat_kd.study.__main__ import main

    out = tmp_path / "study"
    corpus = small_multi30k(tmp_path / "multi30k")
    assert main(["micro", "--out", str(out), "--data-dir", corpus]) == 0
    results = out / "results"
    for figure in ["students_vs_teacher_capacity.png", "born_again.png", "analysis/complexity_vs_faithfulness.png",
                   "modes/mode_mix.png"]:
        assert (results / figure).stat().st_size > 10_000, figure  # a real PNG, not an empty file
    text = (results / "results.md").read_text()
    for title in ["## 1. Teachers", "## 2. Distilled", "## 3. NAT students", "## 4. Born-Again", "## 5. Multi-modality"]:
        assert title in text
    cfg = study_config.load("micro")
    assert f"steps ran {cfg.jobs} at a time, 1 torch thread each" in text
    # fairseq-train's own speed reports, each family from scratch, two rounds taking turns
    speed = json.loads((results / "results.json").read_text())["steps"]["training_speed"]["result"]
    assert [(r["family"], r["round"]) for r in speed["runs"]] == [("nat", 1), ("glat", 1), ("glat", 2), ("nat", 2)]
    assert all(r["updates_per_second"] > 0 for r in speed["runs"]) and speed["ratio"]["nat"] == 1.0
    assert "## Training speed" in text and "| glat |" in text.split("## Training speed", 1)[1]
    data = json.loads((results / "results.json").read_text())
    steps = data["steps"]
    assert set(steps) == {s.name for s in build_plan(cfg, results)}
    # every table cell that a step fills is filled: students x data, teachers, born-again
    for name in ["real", "t1.beam", "t2.beam", "t2.sampling"]:
        assert f"| {name} | {steps[f'student.nat.{name}']['result']['test_bleu']:.2f} |" in text
    for t in cfg.teachers:
        assert steps[f"teacher.{t.name}"]["result"]["parameters"] > 0
    analysis = {row["name"]: row for row in steps["analysis"]["result"]["rows"]}
    assert set(analysis) == {"real", "t1.beam", "t2.beam", "t2.sampling"}
    assert analysis["real"]["faithfulness"] == pytest.approx(0.0, abs=1e-9)  # the real data against itself
    modes = {row["name"]: row for row in steps["modes.analysis"]["result"]["rows"]}
    assert modes["real training targets"]["argmax_share"] == pytest.approx({"de": 1 / 3, "fr": 1 / 3, "cs": 1 / 3})
    # each distilled set is line-aligned with the training data it replaces
    train = (Path(steps["prepare"]["result"]["dir"]) / "raw" / "train.de").read_text().count("\n")
    for name in ["t1.beam", "t2.beam", "t2.sampling"]:
        assert (Path(steps[f"distil.{name}"]["result"]["dir"]) / "train.de").read_text().count("\n") == train == 120
    (results / "results.md").unlink()
    capsys.readouterr()
    # resumption: a second run finds every step done, runs none, and rewrites the results
    assert main(["micro", "--out", str(out), "--data-dir", corpus]) == 0
    assert f"ran 0 step(s), {len(steps)} already done" in capsys.readouterr().out
    assert (results / "results.md").read_text() == text
    # --results-only re-renders the tables from the records without running or checking any step
    (results / "results.md").unlink()
    assert main(["micro", "--out", str(out), "--data-dir", corpus, "--results-only"]) == 0
    assert f"{len(steps)} of {len(steps)} steps done, none run" in capsys.readouterr().out
    assert (results / "results.md").read_text() == text  # it names the command that runs the study
    assert "Partial results" not in text
    # rendered mid-run, the page names the steps still to run and leaves their cells empty
    record = out / "steps" / "student.nat.t2.beam.json"
    record.rename(record.with_suffix(".away"))
    # as if killed in mid-curve: its work folder, begun with the same inputs, holds a learning curve
    (out / "work" / "student.nat.t2.beam" / "curve.json").write_text('[{"updates": 1, "valid_bleu": 2.5}]')
    assert main(["micro", "--out", str(out), "--data-dir", corpus, "--results-only"]) == 0
    assert f"{len(steps) - 1} of {len(steps)} steps done, none run" in capsys.readouterr().out
    partial = (results / "results.md").read_text()
    assert (f"**Partial results**: {len(steps) - 1} of {len(steps)} steps done; still to run: "
            "`student.nat.t2.beam` (measured to 1 update, best validation BLEU 2.50 at 1).") in partial
    assert "| t2.beam | - |" in partial and "| t2.beam | - |" not in text


# ------------------------------------------------------------------ kd-effect profile in miniature, end to end


@pytest.mark.slow
def test_kd_effect_micro_profile_fills_every_table_and_resumes(tmp_path, capsys):
    from nat_kd.study.__main__ import main

    out, corpus, results, text, steps, cfg = run_profile("kd-effect-micro", tmp_path)
    for figure in ["validation_bleu_curves.png", "complexity_faithfulness_detailed.png",
                   "analysis/complexity_vs_faithfulness.png"]:
        assert (results / figure).stat().st_size > 10_000, figure
    sets = ["real", "converged.beam", "weak.beam"]
    # students: a test BLEU in every cell, a curve for every student, chosen on validation BLEU
    for data in sets:
        cells = [f"{steps[f'student.{f}.{data}']['result']['test_bleu']:.2f}" for f in cfg.student_families]
        assert f"| {data} | {' | '.join(cells)} |" in text
        for family in cfg.student_families:
            r = steps[f"student.{family}.{data}"]["result"]
            assert [p["updates"] for p in r["curve"]] == [1] and r["checkpoint"].endswith("checkpoint_bleu_best.pt")
            assert f"| {family} on {data} | {r['valid_bleu']:.2f} | 1 | 1 | no |" in text
    teacher = steps["teacher.converged"]["result"]
    updates = [p["updates"] for p in teacher["curve"]]
    assert updates == list(range(1, len(updates) + 1)) and updates[-1] == teacher["updates_trained"] <= 2
    assert teacher["valid_bleu"] == max(p["valid_bleu"] for p in teacher["curve"])
    assert "curve" not in steps["teacher.weak"]["result"]  # the main job's teacher: fairseq's best checkpoint
    # a curve's chunks save at their own end only (killed midway, a chunk reruns as it ran); a training chosen
    # by fairseq's validation loss saves at every epoch's end, where it measures it
    curve, weak = ([line for line in (out / "logs" / f"teacher.{name}.log").read_text().splitlines()
                    if line.startswith("$ python -m fairseq_cli.train ")] for name in ("converged", "weak"))
    assert curve and all("--save-interval 1000000000 " in command for command in curve)
    assert weak and not any("--save-interval " in command for command in weak)
    # the detailed analysis: a filled row per set in each of its three tables
    rows = {r["name"]: r for r in steps["analysis"]["result"]["rows"]}
    assert set(rows) == set(sets)
    real = rows["real"]
    assert all(f == pytest.approx(0.0, abs=1e-9) for f in real["faithfulness_floors"].values())
    assert real["missing_mass"] == 0.0 and real["faithfulness_interpolated"] > 0  # interpolation costs the real data too
    from nat_kd.analysis.tokenizers import get_tokenizer

    sources = (Path(steps["prepare"]["result"]["dir"]) / "raw" / "train.en").read_text().splitlines()
    source_types = {w for line in get_tokenizer("13a", lowercase=True).corpus(sources) for w in line.split()}
    assert sum(b["words"] for b in real["complexity_buckets"]) == len(source_types)  # each word in one bucket
    for title in ["C(d) by source-word frequency", "F(d) against the smoothing", "The targets' surface"]:
        section = text.split(title, 1)[1].split("###", 1)[0]
        for name in sets:
            line = next(row_line for row_line in section.splitlines() if row_line.startswith(f"| {name} |"))
            assert "| - |" not in line, line
    capsys.readouterr()
    assert main(["kd-effect-micro", "--out", str(out), "--data-dir", corpus, "--list"]) == 0
    assert capsys.readouterr().out.split().count("done") == len(steps)
    assert main(["kd-effect-micro", "--out", str(out), "--data-dir", corpus]) == 0
    assert f"ran 0 step(s), {len(steps)} already done" in capsys.readouterr().out


@pytest.mark.slow
def test_ladder_micro_profile_draws_the_central_figure_and_resumes(tmp_path, capsys):
    """Two teachers of distinct sizes under one stopping rule, each teacher's beam set analysed, the student on
    each: the figure, the table (the teachers' BLEU, both C(d) of each set, the student's BLEU, its peak) and
    the verdicts are written from the records; a rerun finds every step done."""
    from nat_kd.study.__main__ import main

    store = tmp_path / "store"
    out, corpus, results, text, steps, cfg = run_profile("ladder-micro", tmp_path, evaluation=40,
                                                         extra=("--store", str(store)))
    assert (results / "students_vs_teacher_size.png").stat().st_size > 10_000
    section = text.split("## The central figure", 1)[1]
    # the store keeps the results as rendered, the study folder written as DIR
    committed = (store / "results" / "results.md").read_text()
    assert committed.startswith("# Distillation study: profile `ladder-micro`\n\nCommand: `python -m nat_kd.study "
                                "ladder-micro --out DIR ") and str(out) not in committed
    assert committed.split("## The central figure", 1)[1] == section.replace(str(out), "DIR")
    assert (store / "results" / "students_vs_teacher_size.png").read_bytes() == (
        results / "students_vs_teacher_size.png").read_bytes()
    from nat_kd.study.plan import analysis_result

    # each set measured by a step of its own against the same real data
    analyses = sorted(name for name in steps if name.startswith("analysis"))
    assert analyses == sorted(f"analysis.distil.{t.name}.beam" for t in cfg.teachers)
    assert len({json.dumps(steps[a]["result"]["rows"][0], sort_keys=True) for a in analyses}) == 1
    rows = rows_of_analysis = {r["name"]: r for r in analysis_result({n: s["result"] for n, s in steps.items()})["rows"]}
    assert sorted(rows) == sorted(["real", *(f"{t.name}.beam" for t in cfg.teachers)])
    for t in cfg.teachers:
        teacher = steps[f"teacher.{t.name}"]["result"]
        # the one stopping rule: a measurement every 2 updates, stopped one measurement after the last best
        measured = [p["updates"] for p in teacher["curve"]]
        assert measured[0] == 2 and teacher["best_updates"] in measured and measured[-1] <= 4
    bleu = [steps[f"student.nat.{t.name}.beam"]["result"]["test_bleu"] for t in cfg.teachers]
    peak = cfg.teachers[max(range(2), key=lambda i: (bleu[i], -i))].name
    from nat_kd.study.central_table import paired_bootstrap, p_value_cell

    def hypotheses(name):
        return Path(steps[f"student.nat.{name}.beam"]["result"]["test_hypotheses"]).read_text().splitlines()

    references = (out / "work" / "prepare" / "data" / "raw" / "test.de").read_text().splitlines()
    p = paired_bootstrap(hypotheses(peak), {t.name: hypotheses(t.name) for t in cfg.teachers if t.name != peak},
                         references)
    cells = [f"**{b:.2f}**" if t.name == peak else f"{b:.2f} (p {p_value_cell(p[t.name])})"
             for t, b in zip(cfg.teachers, bleu)]
    assert f"| nat | {' | '.join(cells)} | {steps['student.nat.real']['result']['test_bleu']:.2f} | {peak} |" in section
    assert ("| C(d) paper | " + " | ".join(f"{rows[f'{t.name}.beam']['complexity']:.3f}" for t in cfg.teachers)
            in section)
    assert "**Does every curve rise, then fall?**\n\n- nat: " in section  # its wording: test_study.py
    capsys.readouterr()
    assert main(["ladder-micro", "--out", str(out), "--data-dir", corpus]) == 0
    assert f"ran 0 step(s), {len(steps)} already done" in capsys.readouterr().out
    # the folder is lost, the store kept: only the corpus and the analysis are made again, the same results
    sets = {name: sorted((p.relative_to(out / "work" / name), p.read_bytes())
                         for p in (out / "work" / name).rglob("*") if p.is_file() and not p.name.startswith("."))
            for name in steps if name.startswith("distil.")}
    shutil.rmtree(out)
    # what a run would do, said before it: the kept steps restored, the corpus and the analysis made again
    def listed(store_folder):
        capsys.readouterr()
        assert main(["ladder-micro", "--out", str(out), "--data-dir", corpus, "--store", str(store_folder),
                     "--list"]) == 0
        return {line.rsplit(maxsplit=1)[1]: line.rsplit(maxsplit=1)[0].strip()
                for line in capsys.readouterr().out.splitlines() if line[:1].isalpha()}

    kept = set(steps) - {"prepare", *analyses}
    assert listed(store) == {name: "stored" if name in kept else "to run" for name in steps}
    assert not out.exists()
    partial = tmp_path / "partial"  # a store without tiny's set: its teacher trains again to make it
    shutil.copytree(store, partial)
    (partial / "steps" / "distil.tiny.beam.json").unlink()
    states = listed(partial)
    assert (states["teacher.tiny"], states["distil.tiny.beam"], states["teacher.small"]) == ("to run", "to run", "stored")
    assert states["student.nat.tiny.beam"] == "to run" and states["student.nat.small.beam"] == "stored"
    capsys.readouterr()  # --hours plans on the same states: no estimate for a kept step, and none is run
    assert main(["ladder-micro", "--out", str(tmp_path / "planned"), "--data-dir", corpus, "--store", str(partial),
                 "--hours", "5", "--only", "student.nat.small.beam"]) == 0
    printed = capsys.readouterr().out
    assert "stored  teacher.small  restored from the store\n" in printed and "ran 1 step(s), 3 already done" in printed
    assert re.search(r"^to run  prepare  \S", printed, re.M) and "teacher.tiny" not in printed
    assert main(["ladder-micro", "--out", str(out), "--data-dir", corpus, "--store", str(store)]) == 0
    assert f"ran 3 step(s), {len(steps) - 3} already done" in capsys.readouterr().out
    restored = {name for name in steps if "restored" in json.loads((out / "steps" / f"{name}.json").read_text())}
    assert restored == set(steps) - {"prepare", *analyses}
    def without_rerun_times(markdown):  # the steps that ran again took their own wall times, and the total
        return [line for line in markdown.splitlines()
                if not re.match(r"\| (prepare|analysis\.[\w.]+) \| [\d.,]+ \||Total step time: ", line)]

    assert without_rerun_times((results / "results.md").read_text()) == without_rerun_times(text)
    assert len(without_rerun_times(text)) == len(text.splitlines()) - 4
    for name, files in sets.items():  # every file of each set, bin/ included, byte for byte
        assert sorted((p.relative_to(out / "work" / name), p.read_bytes())
                      for p in (out / "work" / name).rglob("*") if p.is_file() and not p.name.startswith(".")) == files

    # the store's page of its sets: a row each with its records' figures, and commands that work as printed
    page = (store / "distilled_sets.md").read_text()
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
            for line in page.splitlines() if line.startswith("| `distil.")}
    assert sorted(rows) == sorted(sets)
    for name, row in rows.items():
        teacher = steps[steps[name]["settings"]["teacher"]]["result"]
        assert row[:4] == [steps[name]["settings"]["teacher"], f"{teacher['parameters']:,}",
                           f"{teacher['test_bleu']:.2f}", f"{steps[name]['result']['sentences']:,}"]
        assert row[4] == f"{rows_of_analysis[steps[name]['result']['name']]['complexity']:.4f}"
        assert f"sha256 `{json.loads((store / 'steps' / f'{name}.json').read_text())['kept']['sha256']}`" in page
    restore, train = [block.split("\n")[1] for block in page.split("```bash")[1:3]]
    mine = tmp_path / "mine"
    argv = restore.replace("STUDY", str(mine)).split()
    assert argv[:4] == ["python", "-m", "nat_kd.study", "ladder-micro"] and argv[-2] == "--only"
    assert main([*argv[3:], "--data-dir", corpus]) == 0  # only the corpus is made: the set is restored
    assert "ran 1 step(s), " in capsys.readouterr().out and not list(mine.rglob("*.pt"))  # no model trained
    student = shlex.split(train.replace("STUDY", str(mine)).replace("SAVE_DIR", str(tmp_path / "save")))
    proc = subprocess.run([sys.executable, "-m", "fairseq_cli.train", *student[1:], "--cpu"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0 and (tmp_path / "save" / "checkpoint_last.pt").is_file(), proc.stdout[-2000:]

    # a set is measured without the other rungs: tiny's analysis needs neither the small teacher nor its set
    solo = tmp_path / "solo"
    capsys.readouterr()
    committed = (store / "results" / "results.md").read_text()
    assert main(["ladder-micro", "--out", str(solo), "--data-dir", corpus, "--store", str(store),
                 "--only", "analysis.distil.tiny.beam"]) == 0
    printed = capsys.readouterr().out
    assert "ran 2 step(s), 2 already done" in printed  # prepare and the analysis; tiny's restored
    # a folder with fewer steps than the store leaves the store's results as they were
    assert "the store's results/ left as they are: " in printed
    assert (store / "results" / "results.md").read_text() == committed

    def measures(step_folder):  # the rows less the paths of the files they were read from
        rows = json.loads((step_folder / "analysis.distil.tiny.beam.json").read_text())["result"]["rows"]
        return [{k: v for k, v in row.items() if k not in ("src", "tgt")} for row in rows]

    assert measures(solo / "steps") == measures(out / "steps")
