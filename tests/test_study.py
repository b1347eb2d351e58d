"""The study driver: config checks, the step runner's skip/redo/resume rules, results tables (the profiles end to
end: test_study_profiles.py, test_study_decoding_profile.py)."""
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from nat_kd.study import config as study_config
from nat_kd.study.config import ConfigError
from nat_kd.study.plan import build_plan
from nat_kd.engine.runner import Runner, Step, StepError

# ------------------------------------------------------------------ config


@pytest.mark.parametrize("profile", ["micro", "cpu", "paper"])
def test_bundled_profiles_load_and_plan_every_experiment(profile, tmp_path):
    cfg = study_config.load(profile)
    names = [s.name for s in build_plan(cfg, tmp_path)]
    assert len(names) == len(set(names))
    assert {"prepare", "analysis", "modes.analysis"} <= set(names)
    assert {f"teacher.{t.name}" for t in cfg.teachers} <= set(names)
    expected_students = {f"student.{f}.{d}" for f in cfg.student_families
                         for d in ["real"] + [s.name for s in cfg.distilled]}
    assert expected_students <= set(names)
    assert f"born_again.{cfg.born_again_rounds}.student" in names


@pytest.mark.parametrize("profile", study_config.profile_names())
def test_every_profile_plans_each_step_after_the_steps_it_reads(profile, tmp_path):
    """One pass in plan order meets each step's dependencies first (--list, --hours and a cluster's
    submission make one): kd-methods lists its Selective KD mix with the mixes, but it reads the student that
    evaluates it, so the plan puts the mix right after that student."""
    steps = build_plan(study_config.load(profile), tmp_path)
    seen = set()
    for step in steps:
        assert set(step.deps) <= seen, (step.name, set(step.deps) - seen)
        seen.add(step.name)
    if profile == "kd-methods":
        names = [s.name for s in steps]
        assert names[names.index("student.glat_ctc.converged.beam") + 1] == "mix.selective-kd"


def test_steps_out_of_dependency_order_are_put_in_it_and_a_cycle_is_left_at_the_end():
    from nat_kd.engine.runner import in_dependency_order

    def step(name, *deps):
        return Step(name, "x", {}, lambda ctx: {}, list(deps))

    plan = [step("a"), step("mix", "judge"), step("b", "a"), step("judge", "a"), step("c", "a"),
            step("x", "y"), step("y", "x")]
    assert [s.name for s in in_dependency_order(plan)] == ["a", "b", "judge", "mix", "c", "x", "y"]


def test_cpu_profile_is_the_study_design():
    cfg = study_config.load("cpu")
    assert len(cfg.teachers) == 4
    beam_teachers = {d.teacher for d in cfg.distilled if d.strategy == "beam"}
    assert beam_teachers == {t.name for t in cfg.teachers}
    middle = {d.strategy for d in cfg.distilled if d.teacher == "t3"}
    assert middle == {"beam", "greedy", "topk", "sampling", "seq-inter"}
    assert cfg.decoding["top_k"] == 10
    assert {"nat", "cmlm"} <= set(cfg.student_families)


def _write(tmp_path, text):
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


MINIMAL = """
[[teachers.models]]
name = "a"
embed_dim = 8
ffn_dim = 8
layers = 1
heads = 1
[teachers.training]
updates = 1
[students.model]
embed_dim = 8
ffn_dim = 8
layers = 1
heads = 1
[students.training]
updates = 1
"""


def test_minimal_config_gets_defaults(tmp_path):
    cfg = study_config.load(_write(tmp_path, MINIMAL))
    assert cfg.name == "study" and cfg.src == "en" and cfg.tgt == "de"
    assert [d.name for d in cfg.distilled] == ["a.beam", "a.greedy", "a.topk", "a.sampling", "a.seq-inter"]
    assert cfg.modes is None and cfg.born_again_rounds == 0


@pytest.mark.parametrize("extra, message", [
    ("[study]\nvocab_sise = 10\n", "unknown key(s) vocab_sise"),
    ("[distill]\nmethods = ['beam', 'nucleus']\n", "unknown strategy 'nucleus'"),
    ("[distill]\nmethods_teacher = 'zz'\n", "teacher 'zz' is not one of"),
    ("[distill]\ntop_kk = 3\n", "unknown key(s) top_kk"),
    ("[students]\nfamilies = ['nat', 'gpt']\n", "unknown 'gpt'"),
    ("[evaluation]\nsplits = ['valid']\n", "must include 'test'"),
    ("[teachers.models.training]\npatience = 2\n", "a: patience = 2 needs bleu_every > 0"),
    ("[teachers.models.training]\nglance_anneal_updates = 9\n", "glance_anneal_updates is for glancing students"),
    ("[teachers.models.training]\nupdate = 2\n", "a: training: unknown key(s) update"),
    ("[analysis]\ninterpolation = 1.5\n", "must be in (0, 1)"),
    ("[analysis]\nbucket = [1]\n", "unknown key(s) bucket"),
    ("[study]\njobs = 'two'\n", "expected an integer"),
])
def test_config_errors_name_the_file_and_the_key(tmp_path, extra, message):
    path = _write(tmp_path, MINIMAL + extra)
    with pytest.raises(ConfigError) as err:
        study_config.load(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_a_teacher_training_overrides_the_teachers_defaults(tmp_path):
    cfg = study_config.load(_write(tmp_path, MINIMAL.replace("[teachers.training]\nupdates = 1\n",
                                                             "[teachers.training]\nupdates = 1\nlr = 0.5\n")
                                   + "[teachers.models.training]\nupdates = 9\nbleu_every = 3\npatience = 2\n"))
    (teacher,) = cfg.teachers
    assert (teacher.training.updates, teacher.training.lr, teacher.training.patience) == (9, 0.5, 2)
    assert cfg.teacher_training.updates == 1  # the defaults themselves are unchanged


def test_kd_effect_profile_is_the_converged_teacher_experiment(tmp_path):
    cfg = study_config.load("kd-effect")
    converged, weak = cfg.teachers
    assert converged.shape == weak.shape and converged.training.patience > 0
    assert converged.training.bleu_every and 600 % converged.training.bleu_every == 0  # the weak point is on the curve
    # the weak teacher is the main job's: 600 updates, lr 1e-3, warmup 200, weight decay 1e-4, 4k tokens
    assert (weak.training.updates, weak.training.lr, weak.training.warmup, weak.training.weight_decay,
            weak.training.max_tokens, weak.training.bleu_every) == (600, 1e-3, 200, 1e-4, 4096, 0)
    assert [(d.teacher, d.strategy) for d in cfg.distilled] == [("converged", "beam"), ("weak", "beam")]
    assert cfg.decoding["beam"] == 5 and len(cfg.student_families) >= 2 and cfg.student_training.bleu_every
    assert cfg.analysis["detailed"] and cfg.train_limit is None and cfg.vocab_size == 8000
    names = [s.name for s in build_plan(cfg, tmp_path)]
    # one step at a time runs them in this order: what tells the most first
    assert names[:6] == ["prepare", "teacher.converged", "distil.converged.beam", "teacher.weak", "distil.weak.beam",
                         "analysis"]
    assert set(names[6:]) == {f"student.{f}.{d}" for f in cfg.student_families
                              for d in ["real", "converged.beam", "weak.beam"]}


def test_toml_syntax_error_names_the_line(tmp_path):
    path = _write(tmp_path, MINIMAL + "[study\n")
    with pytest.raises(ConfigError, match=rf"{path}.*line \d+"):
        study_config.load(path)


def test_unknown_profile_and_help_list_the_bundled_ones(capsys):
    from nat_kd.study.__main__ import main

    names = "capacity, cpu, decoding, decoding-micro, kd-effect, kd-effect-micro, kd-methods, ladder, ladder-micro, micro, paper, students"
    with pytest.raises(ConfigError, match=names):
        study_config.load("nonesuch")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"a bundled profile ({names}) or a TOML file" in " ".join(capsys.readouterr().out.split()).replace("- ", "-")


def test_a_corpus_file_runs_a_profile_on_your_own_corpus(tmp_path):
    """--corpus C.toml: its [corpus] (paths relative to it) and [study] src, tgt replace the profile's; the
    multi-modality experiment, which needs Multi30k's four languages, is left out."""
    from nat_kd.prepare import PrepareConfig, fingerprint

    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    for split in ("train", "dev", "test"):
        for lang in ("en", "ro"):
            (corpus_dir / f"{split}.{lang}").write_text(f"{split} {lang}\n")
    (corpus_dir / "bpe.codes").write_text("#version: 0.2\n")
    overlay = tmp_path / "mine.toml"
    overlay.write_text('[study]\nsrc = "en"\ntgt = "ro"\n[corpus]\ntrainpref = "corpus/train"\n'
                       'validpref = "corpus/dev"\ntestpref = "corpus/test"\nbpe_codes = "corpus/bpe.codes"\n'
                       'tokenizer = "moses"\n')
    cfg = study_config.load("cpu", overlay)
    assert (cfg.src, cfg.tgt, cfg.modes) == ("en", "ro", None) and len(cfg.teachers) == 4
    assert cfg.corpus == {"trainpref": str(corpus_dir / "train"), "validpref": str(corpus_dir / "dev"),
                          "testpref": str(corpus_dir / "test"), "bpe_codes": str(corpus_dir / "bpe.codes"),
                          "tokenizer": "moses"}
    steps = {s.name: s for s in build_plan(cfg, tmp_path / "r")}
    assert not [name for name in steps if name.startswith("modes.")]
    own = PrepareConfig("en", "ro", cfg.vocab_size, train_limit=cfg.train_limit, **cfg.corpus)
    assert steps["prepare"].settings["corpus"] == fingerprint(None, own)[0]  # the raw files' content


@pytest.mark.parametrize("corpus, message", [
    ('prepared = "p"\ntrainpref = "t"\n', "either prepared = DIR"),
    ('trainpref = "t"\nvalidpref = "v"\n', "give validpref and testpref"),
    ('prepared = "p"\ntokenizer = "moses"\n', "tokenizer apply to raw prefixes only"),
    ('trainpref = 3\n', "expected a string"),
])
def test_corpus_section_errors(tmp_path, corpus, message):
    overlay = tmp_path / "c.toml"
    overlay.write_text("[corpus]\n" + corpus)
    with pytest.raises(ConfigError, match=message):
        study_config.load("micro", overlay)
    overlay.write_text('[corpus]\nprepared = "p"\n[students]\nfamilies = ["nat"]\n')
    with pytest.raises(ConfigError, match=r"holds \[corpus\] and \[study\] src, tgt only"):
        study_config.load("micro", overlay)


# ------------------------------------------------------------------ runner


def _step(name, value, calls, deps=(), fail=False):
    """A step writing ``value`` (plus its dependencies' values) to work/out.txt and logging its calls."""

    def run(ctx):
        calls.append(name)
        if fail:
            raise RuntimeError("boom")
        text = value + "".join(ctx.results[d]["text"] for d in deps)
        (ctx.work / "out.txt").write_text(text)
        return {"text": text, "outputs": [str(ctx.work / "out.txt")]}

    return Step(name, "test", {"value": value}, run, list(deps))


def test_runner_skips_done_steps_and_redoes_only_what_changed(tmp_path):
    calls = []
    plan = lambda a, b, c: [_step("a", a, calls), _step("b", b, calls, ["a"]), _step("c", c, calls)]  # noqa: E731
    records = Runner(tmp_path, jobs=2).run(plan("1", "2", "3"))
    assert sorted(calls) == ["a", "b", "c"] and records["b"]["result"]["text"] == "21"
    calls.clear()
    runner = Runner(tmp_path, jobs=2)
    runner.run(plan("1", "2", "3"))
    assert calls == [] and sorted(runner.skipped) == ["a", "b", "c"]
    # a changed setting redoes that step and what depends on it, nothing else
    records = Runner(tmp_path, jobs=2).run(plan("X", "2", "3"))
    assert sorted(calls) == ["a", "b"] and records["b"]["result"]["text"] == "2X"


def test_runner_redoes_a_step_whose_output_was_changed_or_deleted(tmp_path):
    calls = []
    plan = [_step("a", "1", calls), _step("b", "2", calls, ["a"])]
    Runner(tmp_path).run(plan)
    (tmp_path / "work" / "a" / "out.txt").write_text("tampered")
    calls.clear()
    Runner(tmp_path).run(plan)
    assert calls == ["a"]  # same content again, so b's inputs did not change
    (tmp_path / "work" / "b" / "out.txt").unlink()
    calls.clear()
    Runner(tmp_path).run(plan)
    assert calls == ["b"]


def test_runner_failure_keeps_finished_steps_and_resumes(tmp_path):
    calls = []
    with pytest.raises(StepError, match=r"step bad failed: RuntimeError: boom[\s\S]*logs/bad.log"):
        Runner(tmp_path, jobs=1).run([_step("ok", "1", calls), _step("bad", "2", calls, fail=True),
                                      _step("after", "3", calls, ["bad"])])
    assert "after" not in calls
    assert json.loads((tmp_path / "steps" / "ok.json").read_text())["result"]["text"] == "1"
    assert not (tmp_path / "steps" / "bad.json").exists()
    calls.clear()
    Runner(tmp_path, jobs=1).run([_step("ok", "1", calls), _step("bad", "2", calls), _step("after", "3", calls, ["bad"])])
    assert calls == ["bad", "after"]


def test_a_resumed_step_records_the_wall_time_of_all_its_runs(tmp_path):
    import time

    def step(seconds, fail):
        def run(ctx):
            time.sleep(seconds)
            if fail:
                raise RuntimeError("killed")
            (ctx.work / "out.txt").write_text("x")
            return {"outputs": [str(ctx.work / "out.txt")]}
        return Step("a", "test", {}, run)

    with pytest.raises(StepError):
        Runner(tmp_path).run([step(0.3, fail=True)])
    record = Runner(tmp_path).run([step(0.2, fail=False)])["a"]
    assert record["runs"] == 2 and 0.45 <= record["wall_seconds"] < 10  # this run alone: 0.2
    # new inputs wipe the work folder, and its clock with it
    record = Runner(tmp_path).run([Step("a", "test", {"changed": 1}, step(0.0, fail=False).run)])["a"]
    assert record["runs"] == 1 and record["wall_seconds"] < 0.5  # carried over, it would be 0.5 or more


def test_a_step_killed_outright_keeps_its_time_to_the_last_heartbeat(tmp_path):
    import time

    from nat_kd.engine.runner import WALL, StepClock

    clock = StepClock(tmp_path, heartbeat=0.05)
    with clock:
        # the run begins by saving 0.0; wait (however slow the machine) for a heartbeat to save more
        deadline = time.monotonic() + 30
        while (saved := json.loads((tmp_path / WALL).read_text()))["seconds"] == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        elapsed = clock.seconds  # saved is what a kill -9 here would leave
    assert saved["runs"] == 1 and 0.0 < saved["seconds"] <= round(elapsed, 1)
    resumed = StepClock(tmp_path)
    assert resumed.runs == 2 and resumed.earlier == json.loads((tmp_path / WALL).read_text())["seconds"] >= saved["seconds"]


def test_runner_wipes_a_work_folder_left_by_other_inputs(tmp_path):
    calls = []
    Runner(tmp_path).run([_step("a", "1", calls)])
    (tmp_path / "work" / "a" / "checkpoint_last.pt").write_text("from the old settings")
    Runner(tmp_path).run([_step("a", "2", calls)])
    assert not (tmp_path / "work" / "a" / "checkpoint_last.pt").exists()
    # ... but keeps it when the same step is resumed (a killed fairseq-train continues from it)
    (tmp_path / "steps" / "a.json").unlink()
    (tmp_path / "work" / "a" / "checkpoint_last.pt").write_text("same settings")
    Runner(tmp_path).run([_step("a", "2", calls)])
    assert (tmp_path / "work" / "a" / "checkpoint_last.pt").exists()


def test_a_training_continues_its_work_folder_when_only_its_budget_grows(tmp_path):
    """A budgeted step (a training) keeps its work folder for a larger budget with the same other settings,
    and continues it; a smaller budget or another setting wipes it, as a step without a budget always does."""

    def training(updates, lr=1e-3, fail=False):
        def run(ctx):
            trained = ctx.work / "trained_to.txt"  # what a checkpoint_last.pt would say
            start = int(trained.read_text()) if trained.is_file() else 0
            trained.write_text(str(updates))
            if fail:
                raise RuntimeError("killed")
            return {"start": start, "outputs": [str(trained)]}
        return Step("a", "train", {"training": {"updates": updates, "lr": lr}}, run, budget=("updates",))

    def start(step):
        return Runner(tmp_path).run([step])["a"]["result"]["start"]

    assert start(training(3)) == 0
    assert start(training(6)) == 3  # continued from 3
    assert start(training(6)) == 3  # done: the record's, nothing ran
    assert start(training(4)) == 0  # fewer updates than trained: begun again
    assert start(training(8, lr=2e-3)) == 0  # another learning rate: begun again
    # a run of a larger budget killed midway is "begun" for a larger one still, resumed by it
    with pytest.raises(StepError):
        Runner(tmp_path).run([training(12, lr=2e-3, fail=True)])
    assert Runner(tmp_path).states([training(16, lr=2e-3)]) == {"a": "begun"}
    assert Runner(tmp_path).states([training(10, lr=2e-3)]) == {"a": "to run"}
    assert start(training(16, lr=2e-3)) == 12
    # without a budget, any other setting is other inputs
    unbudgeted = Step("a", "train", {"training": {"updates": 20, "lr": 2e-3}}, training(20, lr=2e-3).run)
    assert Runner(tmp_path).run([unbudgeted])["a"]["result"]["start"] == 0


def test_records_say_how_the_steps_ran_and_the_results_report_it(tmp_path):
    from nat_kd.study.results import _layout

    calls = []
    Runner(tmp_path / "a", jobs=2, threads=1).run([_step("x", "1", calls)])
    Runner(tmp_path / "b", jobs=1, threads=3).run([_step("y", "1", calls)])
    x, y = (json.loads((tmp_path / d / "steps" / f"{n}.json").read_text()) for d, n in [("a", "x"), ("b", "y")])
    assert (x["jobs"], x["threads"], y["jobs"], y["threads"]) == (2, 1, 1, 3)
    assert _layout([x]) == "steps ran 2 at a time, 1 torch thread each"
    assert _layout([y, y]) == "steps ran 1 at a time, 3 torch threads each"
    old = {k: v for k, v in x.items() if k not in ("jobs", "threads")}  # a record written before the fields
    for mixed in ([x, y], [x, old]):
        assert _layout(mixed).startswith("steps ran with the layouts in the step wall-time table")
    job = dict(x, launcher={"launcher": "slurm", "job_id": "17", "resources": {"cpus": 8}})  # not "8 threads"
    assert _layout([job, x]) == ("1 of 2 steps ran as slurm jobs, each with the resources its record names; the "
                                 "rest in the driver's process")


def test_records_name_the_machine_and_the_results_say_where_the_steps_ran(tmp_path):
    """A study resumed on other machines ran on several: the results' hardware line comes from the step records,
    not from the machine that renders the page; a GPU is named only for the steps that ran on it."""
    from nat_kd.machine import hardware
    from nat_kd.study.results import _hardware_line

    calls = []
    Runner(tmp_path, jobs=1, threads=1).run([_step("x", "1", calls)])
    x = json.loads((tmp_path / "steps" / "x.json").read_text())
    here = hardware()
    assert x["hardware"] == here
    xeon = dict(x, hardware={"cpu": "Xeon", "cores": 2, "gpu": None}, device="cpu")
    epyc = dict(x, hardware={"cpu": "EPYC", "cores": 16, "gpu": "H200"}, device="cuda:0")
    epyc_cpu = dict(epyc, device="cpu")  # the GPU was there, the step did not use it
    old = {k: v for k, v in x.items() if k != "hardware"}
    line = _hardware_line([xeon, epyc, old, xeon, epyc_cpu, old])
    assert line == ("steps by machine: Xeon, 2 cores: 2 steps; EPYC, 16 cores, H200: 1 step; EPYC, 16 cores: 1 step; "
                    f"not named (records written before they named it): 2 steps; rendered on {json.dumps(here)}")
    assert _hardware_line([]) == f"steps by machine: none run; rendered on {json.dumps(here)}"


def test_the_machine_names_its_gpu_from_nvidia_smi_without_initialising_cuda(tmp_path, monkeypatch):
    """nvidia-smi's query output, as it prints it (one GPU a line); no nvidia-smi: no GPU."""
    from nat_kd.machine import hardware

    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = "--query-gpu=name" ] && printf "NVIDIA H200\\nNVIDIA H200\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert hardware()["gpu"] == "NVIDIA H200"
    smi.unlink()
    monkeypatch.setenv("PATH", "/nonexistent")
    assert hardware()["gpu"] is None


def test_runner_runs_independent_steps_side_by_side(tmp_path):
    import threading

    barrier = threading.Barrier(2, timeout=20)

    def meet(ctx):
        barrier.wait()  # both must be running at once, or this times out
        return {"outputs": []}

    Runner(tmp_path, jobs=2).run([Step("x", "t", {}, meet), Step("y", "t", {}, meet)])


def test_list_says_which_steps_were_begun_with_the_same_inputs_and_where_their_curves_stand(tmp_path):
    from nat_kd.engine.curve import progress_note

    def training(value):
        def run(ctx):
            (ctx.work / "checkpoints").mkdir()
            (ctx.work / "checkpoints" / "curve.json").write_text(json.dumps(
                [{"updates": 250, "valid_bleu": 3.5}, {"updates": 500, "valid_bleu": 9.25},
                 {"updates": 750, "valid_bleu": 8.0}]))
            raise RuntimeError("killed")
        return Step("student", "train", {"value": value}, run, [])

    calls = []
    with pytest.raises(StepError):
        Runner(tmp_path).run([_step("prepare", "p", calls), training("1")])
    states = lambda value: [line.split() for line in Runner(tmp_path).status(  # noqa: E731
        [_step("prepare", "p", calls), training(value)])]
    assert states("1") == [["done", "prepare"], ["begun", "student"]]
    assert states("2")[1] == ["to", "run", "student"]  # other inputs: the next run starts it afresh
    assert progress_note(tmp_path / "work" / "student") == "measured to 750 updates, best validation BLEU 9.25 at 500"
    assert progress_note(tmp_path / "work" / "prepare") == ""


def test_a_resumed_runner_starts_ready_steps_in_plan_order_not_by_depth(tmp_path):
    calls = []
    chain = lambda: [_step("prepare", "p", calls), _step("teacher", "t", calls, ["prepare"]),  # noqa: E731
                     _step("beam", "b", calls, ["teacher"])]
    Runner(tmp_path, jobs=1).run(chain())
    calls.clear()
    # "student.beam" comes first in the plan but is ready only once the done chain above it is skipped;
    # "student.real.seed2" needs only prepare. One job: the plan's order must decide, not the depth.
    Runner(tmp_path, jobs=1).run(chain() + [_step("student.beam", "s", calls, ["beam"]),
                                            _step("student.real.seed2", "r", calls, ["prepare"])])
    assert calls == ["student.beam", "student.real.seed2"]


def test_prepare_steps_fingerprint_the_raw_corpus_not_its_location(tmp_path):
    import shutil

    from nat_kd.corpus import data_dir

    cfg = study_config.load("micro")
    copies = []
    for name in ("a", "b"):
        copy = tmp_path / name
        copy.mkdir()
        for file in data_dir().iterdir():
            if file.name.split(".")[1] in ("en", "de", "fr", "cs"):
                shutil.copyfile(file, copy / file.name)
        copies.append(copy)
    settings = lambda raw: {s.name: s.settings for s in build_plan(cfg, tmp_path / "r", str(raw))}  # noqa: E731
    first = settings(copies[0])
    assert first == settings(copies[1])  # same content elsewhere: nothing to redo
    test_file = next(copies[1].glob("test_2016_flickr.de*"))
    test_file.write_bytes(test_file.read_bytes()[:-200])  # an edited reference file
    changed = settings(copies[1])
    assert changed["prepare"]["corpus"] != first["prepare"]["corpus"]
    assert changed["teacher.t1"] == first["teacher.t1"]  # redone through its dependency, not its settings


# ------------------------------------------------------------------ validation-BLEU curve


def _fake_training(save_dir, bleu_at, calls):
    """fairseq-train and the validation decode, faked: a checkpoint that knows its update count, a BLEU per
    update count; ``calls`` logs (what, updates)."""
    import torch

    def train(budget):
        calls.append(("train", budget.updates))
        torch.save({"optimizer_history": [{"num_updates": budget.updates}]}, save_dir / "checkpoint_last.pt")
        return save_dir / "checkpoint_best.pt"

    def valid_bleu(checkpoint, hypotheses):
        from nat_kd.engine.curve import checkpoint_updates

        updates = checkpoint_updates(checkpoint)
        calls.append(("valid", updates))
        hypotheses.write_text(f"hypotheses after {updates}\n")
        return {"bleu": bleu_at[updates], "signature": "sig"}

    return train, valid_bleu


def test_curve_keeps_the_best_checkpoint_and_stops_when_out_of_patience(tmp_path):
    from nat_kd.engine.training import Training
    from nat_kd.engine.curve import BEST, checkpoint_updates, train_with_curve

    calls = []
    bleu = {2: 1.0, 4: 3.0, 6: 2.5, 8: 3.0, 10: 9.0}  # 8 ties the best: no improvement
    train, valid = _fake_training(tmp_path, bleu, calls)
    result = train_with_curve(tmp_path, Training(updates=10, bleu_every=2, patience=2), train, valid)
    assert [p["updates"] for p in result["curve"]] == [2, 4, 6, 8]  # never reaches 10
    assert [p["valid_bleu"] for p in result["curve"]] == [1.0, 3.0, 2.5, 3.0]
    assert (result["best_updates"], result["valid_bleu"], result["stopped_early"]) == (4, 3.0, True)
    assert checkpoint_updates(tmp_path / BEST) == 4
    assert (tmp_path / "valid.best.hyp").read_text() == "hypotheses after 4\n"
    assert calls == [(k, n) for n in (2, 4, 6, 8) for k in ("train", "valid")]


def test_curve_without_patience_trains_every_update_and_ends_at_the_budget(tmp_path):
    from nat_kd.engine.training import Training
    from nat_kd.engine.curve import train_with_curve

    calls = []
    train, valid = _fake_training(tmp_path, {3: 5.0, 6: 4.0, 7: 4.5}, calls)
    result = train_with_curve(tmp_path, Training(updates=7, bleu_every=3), train, valid)
    assert [p["updates"] for p in result["curve"]] == [3, 6, 7]  # the last chunk is the remainder
    assert (result["best_updates"], result["updates_trained"], result["stopped_early"]) == (3, 7, False)


def test_curve_resumes_after_a_kill_without_an_extra_update(tmp_path):
    """Killed after training a chunk but before its BLEU: the resumed run measures that checkpoint and does
    not start fairseq-train at its budget (which would take one update more)."""
    import time

    from nat_kd.engine.training import Training
    from nat_kd.engine.curve import train_with_curve

    calls = []
    bleu = {2: 1.0, 4: 2.0, 6: 3.0}
    fake_train, valid = _fake_training(tmp_path, bleu, calls)
    budget = Training(updates=6, bleu_every=2)

    def train(training):  # a chunk that takes a measurable time
        time.sleep(0.2)
        return fake_train(training)

    def killed_after_training(checkpoint, hypotheses):
        if len(calls) == 3:  # train 2, valid 2, train 4: the process dies before measuring 4
            raise KeyboardInterrupt
        return valid(checkpoint, hypotheses)

    with pytest.raises(KeyboardInterrupt):
        train_with_curve(tmp_path, budget, train, killed_after_training)
    calls.clear()
    result = train_with_curve(tmp_path, budget, train, valid)
    assert calls == [("valid", 4), ("train", 6), ("valid", 6)]
    assert [p["updates"] for p in result["curve"]] == [2, 4, 6] and result["best_updates"] == 6
    # the chunk trained before the kill keeps its training time
    assert all(0.2 <= p["train_seconds"] < 10 for p in result["curve"])
    calls.clear()
    assert train_with_curve(tmp_path, budget, train, valid)["curve"] == result["curve"] and calls == []


def test_a_prepared_corpus_step_counts_its_training_pairs(tiny_en_de, tmp_path):
    from types import SimpleNamespace

    from nat_kd.engine.steps import prepare_step

    result = prepare_step(SimpleNamespace(work=tmp_path), src="en", tgt="de", vocab_size=0, train_limit=None,
                          data_dir=None, corpus="x", own={"prepared": str(tiny_en_de)})
    assert result["train_pairs"] == 203 and result["dir"] == str(tiny_en_de)
    assert result["outputs"] == [str(tiny_en_de / "manifest.json")] and not list(tmp_path.iterdir())


@pytest.mark.parametrize("where, extra", [("nat_kd.study.plan.build_plan", []), ("nat_kd.engine.runner.Runner.run", []),
                                          ("nat_kd.study.results.write_results", ["--results-only"])])
def test_ctrl_c_stops_the_local_driver_with_a_line_not_a_traceback(where, extra, tmp_path, monkeypatch, capsys):
    """While the plan hashes the corpus, while steps run, while the results are written: all resumable."""
    from nat_kd.study.__main__ import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupted)
    assert main(["micro", "--out", str(tmp_path / "micro"), *extra]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "stopped; rerun the same command to go on"


@pytest.mark.slow
def test_a_failing_job_raises_with_its_log_and_a_finished_one_writes_its_streams(tmp_path):
    """Jobs run in children of the preloaded job server: a module that fails is reported with its log's
    tail, and one that succeeds leaves its stdout in the named file and its stderr in the log."""
    from nat_kd.engine.fairseq_jobs import run_logged

    log = tmp_path / "job.log"
    with pytest.raises(RuntimeError, match="(?s)exit status 1: python -m fairseq_cli.generate .*--path required for generation"):
        run_logged("fairseq_cli.generate", [tmp_path / "missing-bin", "--task", "translation"], log, threads=1)
    assert log.read_text().startswith(f"$ python -m fairseq_cli.generate {tmp_path / 'missing-bin'} --task")
    out = tmp_path / "help.txt"
    run_logged("nat_kd.generate_distilled", ["--help"], log, threads=1, stdout=out)
    assert "--teacher-path" in out.read_text() and "--teacher-path" not in log.read_text()
    # a module the server did not import runs too, in the folder named: its relative paths are that folder's
    (tmp_path / "text.x").write_text("b a b\n", encoding="utf-8")
    run_logged("fairseq_cli.preprocess", ["--only-source", "--source-lang", "x", "--trainpref", "text",
                                          "--destdir", "bin", "--workers", "1"], log, threads=1, cwd=tmp_path)
    assert (tmp_path / "bin" / "dict.x.txt").read_text(encoding="utf-8").startswith("b 2\na 1\n")


def test_only_selects_the_named_steps_and_what_they_need_in_plan_order():
    from nat_kd.engine.runner import Step, StepError, needed

    plan = [Step("prepare", "prepare", {}, None), Step("teacher", "train", {}, None, ["prepare"]),
            Step("distil", "distil", {}, None, ["prepare", "teacher"]), Step("real", "train", {}, None, ["prepare"]),
            Step("speed", "speed", {}, None, ["prepare"])]
    assert [s.name for s in needed(plan, ["distil"])] == ["prepare", "teacher", "distil"]
    assert [s.name for s in needed(plan, ["speed", "real"])] == ["prepare", "real", "speed"]
    with pytest.raises(StepError, match="--only speeds: no such step in this study's plan"):
        needed(plan, ["speeds"])


def test_current_records_leave_out_a_record_of_other_inputs_which_records_keeps(tmp_path):
    """--only renders the results from the current records: a step whose settings changed since its record (the
    DA-Transformer's recipe, say) is not shown as done; --results-only shows the records there are."""
    def run(ctx):
        (ctx.work / "out.txt").write_text(ctx.step.name)
        return {"outputs": [str(ctx.work / "out.txt")]}

    def plan(b_setting):
        return [Step("a", "k", {"x": 1}, run), Step("b", "k", {"y": b_setting}, run, ["a"]),
                Step("c", "k", {}, run, ["a"])]

    Runner(tmp_path).run(plan(1))
    runner = Runner(tmp_path)
    assert sorted(runner.current_records(plan(2))) == ["a", "c"]
    assert sorted(runner.records(plan(2))) == ["a", "b", "c"]
    assert runner.states(plan(2)) == {"a": "done", "b": "to run", "c": "done"}


def test_a_study_reuses_the_finished_steps_of_another_with_the_same_fingerprint(tmp_path):
    calls = []

    def make(tag):
        def run(ctx):
            calls.append((tag, ctx.step.name))
            out = ctx.work / "out.txt"
            out.write_text(f"{ctx.step.name} {ctx.step.settings}")
            return {"outputs": [str(out)]}
        return run

    def plan(tag, b_setting):
        return [Step("a", "k", {"x": 1}, make(tag)), Step("b", "k", {"y": b_setting}, make(tag), ["a"])]

    Runner(tmp_path / "first").run(plan("first", 1))
    reuse = Runner(tmp_path / "second", reuse=(tmp_path / "first",))
    records = reuse.run(plan("second", 2))  # a is the same step on the same inputs; b's setting differs
    assert calls == [("first", "a"), ("first", "b"), ("second", "b")]
    assert records["a"]["reused_from"] == str((tmp_path / "first").resolve())
    assert (tmp_path / "second" / "steps" / "a.json").is_file() and "reused_from" not in records["b"]
    with pytest.raises(StepError, match="not a study folder"):
        Runner(tmp_path / "third", reuse=(tmp_path / "nowhere",))
    begun = tmp_path / "begun"  # a study whose first step is still running: no record yet, nothing to reuse
    (begun / "work" / "a").mkdir(parents=True)
    assert Runner(tmp_path / "fourth", reuse=(begun,)).run(plan("fourth", 1))["a"].get("reused_from") is None


def test_a_committed_results_json_stands_in_for_a_leaf_step_whose_inputs_have_its_digests(tmp_path):
    """A study whose folder is gone left its results.json: a step no other step needs counts as done where its
    settings match and its inputs have the same digests, whatever the steps that made them are called and
    however they were made (here a teacher trained with other settings to the same data). A step that others
    need is never taken from a record (its outputs are not here); other inputs' bytes run the step."""
    calls = []

    def write(text):
        def run(ctx):
            calls.append(ctx.step.name)
            out = ctx.work / "out.txt"
            out.write_text(text(ctx))
            return {"outputs": [str(out)], "text": out.read_text()}
        return run

    def plan(teacher, patience, data_text="beam"):
        data = f"distil.{teacher}.beam"
        return [Step(f"teacher.{teacher}", "train", {"patience": patience}, write(lambda ctx: f"model {patience}")),
                Step(data, "distil", {"teacher": f"teacher.{teacher}"}, write(lambda ctx: data_text),
                     [f"teacher.{teacher}"]),
                Step("student", "train", {"data": data, "updates": 2000},
                     write(lambda ctx: "student of " + ctx.results[data]["text"]), [data])]

    first = Runner(tmp_path / "first").run(plan("small", 3))
    (tmp_path / "results.json").write_text(json.dumps({"profile": "first", "steps": first}))
    shutil.rmtree(tmp_path / "first")  # the folder is lost; its results.json is committed
    calls.clear()
    records = Runner(tmp_path / "second", reuse=(tmp_path / "results.json",)).run(plan("tiny", 2))
    assert calls == ["teacher.tiny", "distil.tiny.beam"]  # the student's inputs are byte for byte the first's
    reused = records["student"]["reused_record"]
    assert reused["from"] == str(tmp_path / "results.json") and reused["name"] == "student"
    assert records["student"]["result"]["text"] == "student of beam"
    assert Runner(tmp_path / "second").states(plan("tiny", 2))["student"] == "done"  # on the next run too
    calls.clear()
    records = Runner(tmp_path / "third", reuse=(tmp_path / "results.json",)).run(plan("tiny", 2, "other beam"))
    assert calls == ["teacher.tiny", "distil.tiny.beam", "student"] and "reused_record" not in records["student"]
    # the teacher has the first study's settings and inputs, but its distil step needs its checkpoint
    calls.clear()
    Runner(tmp_path / "fourth", reuse=(tmp_path / "results.json",)).run(plan("small", 3))
    assert calls == ["teacher.small", "distil.small.beam"]
    # a step taken from a record in a run of it alone (--only) runs once a step that reads its outputs is planned
    calls.clear()
    alone = Runner(tmp_path / "alone", reuse=(tmp_path / "results.json",)).run(plan("small", 3)[:1])
    assert "reused_record" in alone["teacher.small"] and calls == []
    again = Runner(tmp_path / "alone", reuse=(tmp_path / "results.json",))
    assert again.states(plan("small", 3))["teacher.small"] == "to run"
    again.run(plan("small", 3))
    assert calls == ["teacher.small", "distil.small.beam"]  # the student, a leaf, is still the record
    with pytest.raises(StepError, match="not a study's results.json"):
        (tmp_path / "notes.json").write_text("{}")
        Runner(tmp_path / "fifth", reuse=(tmp_path / "notes.json",))


def _stored_plan(calls, set_value="beam", student_value="2000", rebuilt=str.upper):
    """A teacher whose checkpoint no store keeps, its distilled set (target.txt kept, bin.txt rebuilt from it by
    ``rebuilt``) and a student that keeps its hypotheses: the study's three kinds of step, in miniature."""
    from nat_kd.engine.store import Kept

    def teacher(ctx):
        calls.append("teacher")
        (ctx.work / "model.pt").write_text("weights")
        return {"outputs": [str(ctx.work / "model.pt")], "checkpoint": str(ctx.work / "model.pt")}

    def distil(ctx):
        calls.append("set")
        data = ctx.work / "data"
        data.mkdir()
        (data / "target.txt").write_text(Path(ctx.results["teacher"]["checkpoint"]).read_text() + " " + set_value)
        (data / "bin.txt").write_text(rebuilt((data / "target.txt").read_text()))
        return {"outputs": [str(data / "target.txt")], "dir": str(data)}

    def rebuild(work, results):
        (work / "data" / "bin.txt").write_text((work / "data" / "target.txt").read_text().upper())

    def student(ctx):
        calls.append("student")
        (ctx.work / "test.hyp").write_text("hypotheses of " + (Path(ctx.results["set"]["dir"]) / "bin.txt").read_text())
        (ctx.work / "model.pt").write_text("student weights")
        return {"outputs": [str(ctx.work / "model.pt")], "test_hypotheses": str(ctx.work / "test.hyp")}

    return [Step("teacher", "train", {"updates": 10}, teacher, keep=lambda work, result: Kept([])),
            Step("set", "distil", {"value": set_value}, distil, ["teacher"],
                 keep=lambda work, result: Kept([Path("data/target.txt")], [Path("data/bin.txt")]), rebuild=rebuild),
            Step("student", "train", {"value": student_value}, student, ["set"],
                 keep=lambda work, result: Kept([Path(result["test_hypotheses"]).relative_to(work)]))]


def test_a_study_restores_from_its_store_without_retraining_and_retrains_only_what_a_step_to_run_reads(tmp_path):
    """A store holds every finished step's record (the study folder written as DIR) and what it keeps; from an
    empty folder the set and the student are restored byte for byte (bin.txt rebuilt), the teacher counts as
    done from its record with no checkpoint; a step that must run and reads the teacher's checkpoint has it
    trained again first."""
    calls, store = [], tmp_path / "store"
    first = Runner(tmp_path / "study", store=store).run(_stored_plan(calls))
    assert calls == ["teacher", "set", "student"]
    assert sorted(p.name for p in (store / "kept").iterdir()) == ["set.tar.xz", "student.tar.xz"]
    stored = json.loads((store / "steps" / "set.json").read_text())
    assert stored["result"]["dir"] == "DIR/work/set/data" and str(tmp_path) not in (store / "steps" / "set.json").read_text()
    assert stored["kept"]["files"] == ["data/target.txt"] and list(stored["kept"]["rebuilt"]) == ["data/bin.txt"]
    assert json.loads((store / "steps" / "teacher.json").read_text())["kept"]["files"] == []  # never a checkpoint
    archive = (store / "kept" / "set.tar.xz").read_bytes()
    Runner(tmp_path / "study", store=store).run(_stored_plan(calls))
    assert (store / "kept" / "set.tar.xz").read_bytes() == archive  # unchanged outputs, unchanged archive

    shutil.rmtree(tmp_path / "study")  # the folder is lost; the store is committed
    calls.clear()
    runner = Runner(tmp_path / "study", store=store)
    records = runner.run(_stored_plan(calls))
    assert calls == [] and sorted(runner.skipped) == ["set", "student", "teacher"]
    assert (tmp_path / "study" / "work" / "set" / "data" / "bin.txt").read_text() == "WEIGHTS BEAM"
    assert (tmp_path / "study" / "work" / "student" / "test.hyp").read_text() == "hypotheses of WEIGHTS BEAM"
    assert not (tmp_path / "study" / "work" / "teacher").exists()
    assert records["teacher"]["restored"]["outputs"] is False and records["set"]["restored"]["outputs"] is True
    assert {n: r["result"] for n, r in records.items()} == {n: r["result"] for n, r in first.items()}
    assert set(Runner(tmp_path / "study", store=store).states(_stored_plan(calls)).values()) == {"done"}

    calls.clear()  # another student on the restored set: the teacher's record still stands in
    Runner(tmp_path / "study", store=store).run(_stored_plan(calls, student_value="3000"))
    assert calls == ["student"]
    calls.clear()  # another set reads the teacher's checkpoint, and so does a second one: the teacher trains
    changed = _stored_plan(calls, set_value="sampling")  # again, once, first
    second = Step("set2", "distil", {}, lambda ctx: calls.append("set2") or {"outputs": []}, ["teacher"])
    assert Runner(tmp_path / "study", store=store).states(changed + [second]) == {
        "teacher": "to run", "set": "to run", "student": "to run", "set2": "to run"}
    Runner(tmp_path / "study", store=store).run(changed + [second])
    assert calls[0] == "teacher" and sorted(calls[1:]) == ["set", "set2", "student"]


def test_a_kept_sets_json_and_markdown_name_the_study_folder_as_dir_and_a_restore_elsewhere_names_its_own(tmp_path):
    """The archive does not depend on where the study ran: in meta.json (JSON-escaped) and CARD.md the folder is
    DIR; restored into another folder they name that one; a file that held "DIR/" already, and a data file, are
    kept byte for byte."""
    import io
    import lzma
    import tarfile

    from nat_kd.engine.store import Kept

    def plan(study):
        def distil(ctx):
            data = ctx.work / "data"
            data.mkdir()
            (data / "meta.json").write_text(json.dumps({"source": f"{study}/work/prepare/raw/train.en",
                                                        "sibling": f"{study}2/raw"}))
            (data / "CARD.md").write_text(f"| {study}/work/teacher/model.pt |\n")
            (data / "notes.md").write_text(f"run DIR/x in {study}/work\n")  # DIR/ already: not rewritten
            (data / "train.de").write_text(f"{study}/work is a German sentence\n")  # data: never rewritten
            return {"outputs": [], "dir": str(data)}

        return [Step("set", "distil", {}, distil,
                     keep=lambda work, result: Kept([Path("data") / n for n in ("CARD.md", "meta.json", "notes.md",
                                                                                 "train.de")]))]

    first, elsewhere, store = tmp_path / "a b", tmp_path / "c\\d", tmp_path / "store"
    Runner(first, store=store).run(plan(first))
    stored = json.loads((store / "steps" / "set.json").read_text())
    assert stored["kept"]["relocated"] == ["data/CARD.md", "data/meta.json"]
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress((store / "kept" / "set.tar.xz").read_bytes()))) as tar:
        inside = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert json.loads(inside["data/meta.json"]) == {"source": "DIR/work/prepare/raw/train.en",
                                                    "sibling": f"{first}2/raw"}
    assert inside["data/CARD.md"] == "| DIR/work/teacher/model.pt |\n"
    assert inside["data/notes.md"] == f"run DIR/x in {first}/work\n"
    assert inside["data/train.de"] == f"{first}/work is a German sentence\n"

    runner = Runner(elsewhere, store=store)  # a folder whose name JSON escapes
    runner.run(plan(first))
    assert runner.skipped == ["set"]
    data = elsewhere / "work" / "set" / "data"
    assert json.loads((data / "meta.json").read_text())["source"] == f"{elsewhere}/work/prepare/raw/train.en"
    assert (data / "CARD.md").read_text() == f"| {elsewhere}/work/teacher/model.pt |\n"
    assert (data / "notes.md").read_text() == inside["data/notes.md"]
    assert (data / "train.de").read_text() == inside["data/train.de"]


def test_a_rebuilt_file_that_names_the_study_folder_restores_into_another_folder(tmp_path):
    """A Selective KD set keeps its accuracies and rebuilds the rest, its card copied from its distilled set's,
    which names the teacher's checkpoint by path: the record's digest is of the card with the study folder as
    DIR, so that a restore into another folder matches it, and the card names that folder."""
    from nat_kd.engine.store import Kept

    def card(work, results):
        (work / "data" / "CARD.md").write_text(f"| {results['corpus']['dir']}/checkpoint_best.pt |\n")

    def selection(ctx):
        (ctx.work / "data").mkdir()
        (ctx.work / "data" / "accuracy.txt").write_text("0.5\n")
        card(ctx.work, ctx.results)
        return {"outputs": [], "dir": str(ctx.work / "data")}

    plan = [Step("corpus", "prepare", {}, lambda ctx: {"outputs": [], "dir": str(ctx.work)}),
            Step("selection", "mix", {}, selection, ["corpus"], rebuild=card,
                 keep=lambda work, result: Kept([Path("data/accuracy.txt")], [Path("data/CARD.md")]))]
    store = tmp_path / "store"
    Runner(tmp_path / "first", store=store).run(plan)
    assert str(tmp_path) not in (store / "steps" / "selection.json").read_text()
    runner = Runner(tmp_path / "second", store=store)
    runner.run(plan)
    assert runner.skipped == ["selection"]  # the corpus runs again (no store keeps one); the selection restores
    card_file = tmp_path / "second" / "work" / "selection" / "data" / "CARD.md"
    assert card_file.read_text() == f"| {tmp_path / 'second'}/work/corpus/checkpoint_best.pt |\n"


def test_the_store_keeps_the_results_folder_with_the_study_folder_as_dir(tmp_path):
    """STORE/results/ is the rendered folder with the study folder written as DIR in its .md and .json (as is and
    JSON-escaped, not where it is only a longer name's start), the replacements applied first, a figure byte
    for byte; an unchanged file is not rewritten, and a file the rendering no longer makes goes."""
    from nat_kd.engine.store import Store

    study = tmp_path / 'my "study'  # a quote, which JSON escapes
    results = study / "results"
    (results / "analysis.x").mkdir(parents=True)
    escaped = json.dumps(str(study))[1:-1]
    command = f"python -m nat_kd.study ladder --out '{study}' --only a"
    (results / "results.md").write_text(f"Command: `{command}`\n![f]({study}/results/f.png) {study}2/x {study}\n")
    (results / "results.json").write_text(json.dumps({"command": command, "dir": f"{study}/work/a"}))
    (results / "analysis.x" / "report.md").write_text(f"restored from {tmp_path}/store\n")
    figure = bytes(range(256)) + str(study).encode()
    (results / "f.png").write_bytes(figure)
    store = Store(tmp_path / "store", study)
    replacements = {command: "python -m nat_kd.study ladder --out DIR", json.dumps(command)[1:-1]:
                    "python -m nat_kd.study ladder --out DIR", str(tmp_path / "store"): "docs/results/x"}
    kept = store.keep_results(results, replacements)
    assert kept == tmp_path / "store" / "results"
    assert (kept / "results.md").read_text() == ("Command: `python -m nat_kd.study ladder --out DIR`\n"
                                                 f"![f](DIR/results/f.png) {study}2/x DIR\n")
    assert json.loads((kept / "results.json").read_text()) == {"command": "python -m nat_kd.study ladder --out DIR",
                                                               "dir": "DIR/work/a"}
    assert escaped != str(study) and escaped not in (kept / "results.json").read_text()
    assert (kept / "analysis.x" / "report.md").read_text() == "restored from docs/results/x\n"
    assert (kept / "f.png").read_bytes() == figure
    before = {p.name: p.stat().st_mtime_ns for p in kept.rglob("*") if p.is_file()}
    os.utime(kept / "f.png", ns=(1, 1))
    shutil.rmtree(results / "analysis.x")
    store.keep_results(results, replacements)
    assert (kept / "f.png").stat().st_mtime_ns == 1  # not rewritten
    assert sorted(p.name for p in kept.rglob("*")) == ["f.png", "results.json", "results.md"]
    assert {p.name: p.stat().st_mtime_ns for p in kept.rglob("*") if p.is_file()} == {
        "f.png": 1, "results.md": before["results.md"], "results.json": before["results.json"]}


def test_the_results_name_the_command_that_runs_the_study_not_what_one_run_chose():
    from nat_kd.study.__main__ import study_command

    argv = ["ladder", "--out", "/home/me/ladder", "--only", "teacher.tiny", "--jobs", "1", "--hours=2.5",
            "--results-only", "--store", "/home/me/repo/docs/results/ladder", "--data-dir=/data/multi30k",
            "--reuse", "a b.json"]
    assert study_command(argv) == ("python -m nat_kd.study ladder --out /home/me/ladder --jobs 1 --store "
                                   "/home/me/repo/docs/results/ladder --data-dir=/data/multi30k --reuse 'a b.json'")
    assert study_command(argv, {"--out": "DIR", "--store": "docs/results/ladder", "--data-dir": "DATA_DIR"}) == (
        "python -m nat_kd.study ladder --out DIR --jobs 1 --store docs/results/ladder --data-dir DATA_DIR "
        "--reuse 'a b.json'")


def test_a_stored_file_that_does_not_match_its_record_is_refused_in_one_line(tmp_path):
    from nat_kd.engine.store import StoreError

    calls, store = [], tmp_path / "store"
    Runner(tmp_path / "study", store=store).run(_stored_plan(calls))
    archive = store / "kept" / "set.tar.xz"
    good = archive.read_bytes()
    archive.write_bytes(good[:-8] + bytes(8))
    shutil.rmtree(tmp_path / "study")
    with pytest.raises(StoreError, match=rf"^{re.escape(str(archive))}: its sha256 is not the one .*steps/set.json "
                                         r"records.*restore both from git, or delete both"):
        Runner(tmp_path / "study", store=store).run(_stored_plan(calls))
    assert not (tmp_path / "study" / "work" / "set").exists()
    archive.write_bytes(good)  # the archive is right, but what is rebuilt from it is not the step's own
    plan = _stored_plan(calls)
    plan[1].rebuild = lambda work, results: (work / "data" / "bin.txt").write_text("something else")
    with pytest.raises(StoreError, match=r"data/bin.txt rebuilt from it differs from the step's own"):
        Runner(tmp_path / "study", store=store).run(plan)
    assert not (tmp_path / "study" / "work" / "set").exists()


def test_hours_starts_only_the_steps_whose_estimate_from_records_of_their_kind_and_shape_fits(tmp_path):
    """--hours: a training's estimate is the seconds an update of finished trainings of the same architecture,
    shape and batch (3.6 s here, from committed records), times the updates its budget has left (a begun
    curve counts what it trained, at its last timed chunk's rate where it has one); a step with no such record
    has none; neither of those two starts, nor one whose own rate makes it too long. A record whose run only
    evaluated a training finished before (15 s of wall time) goes by its curve's training time."""
    from nat_kd.engine.estimate import hours

    shape = {"layers": 2, "embed_dim": 128}

    def settings(updates, arch="kd_nat_tiny"):
        return {"arch": arch, "shape": shape, "nat_family": "nat",
                "training": {"updates": updates, "max_tokens": 4096, "bleu_every": 250}}

    committed = {"student.old": {"name": "student.old", "kind": "train", "settings": settings(1000), "deps": [],
                                 "digest": "d", "fingerprint": "f", "wall_seconds": 3600.0, "threads": 1,
                                 "result": {"updates_trained": 1000, "outputs": []}},
                 "student.resumed": {"name": "student.resumed", "kind": "train", "settings": settings(1000),
                                     "deps": [], "digest": "d2", "fingerprint": "f2", "wall_seconds": 15.0,
                                     "threads": 1, "result": {"updates_trained": 1000, "outputs": [], "curve": [
                                         {"updates": 500, "valid_bleu": 1.0, "train_seconds": 1700.0},
                                         {"updates": 1000, "valid_bleu": 2.0, "train_seconds": 1900.0}]}}}
    (tmp_path / "results.json").write_text(json.dumps({"steps": committed}))
    calls = []

    def train(name, updates, arch="kd_nat_tiny"):
        return Step(name, "train", settings(updates, arch), lambda ctx: calls.append(name) or {"outputs": []})

    plan = [train("short", 500), train("long", 2000), train("begun", 2000), train("other", 10, "kd_glat_tiny"),
            train("slow", 2000)]
    curve = tmp_path / "study" / "work" / "begun" / "checkpoints" / "curve.json"
    curve.parent.mkdir(parents=True)
    curve.write_text(json.dumps([{"updates": 1250, "valid_bleu": 1.0}, {"updates": 1500, "valid_bleu": 2.0}]))
    # a begun training whose last chunk was timed here: 250 updates in 2,500 s, 10 s an update, not the 3.6
    slow = tmp_path / "study" / "work" / "slow" / "checkpoints" / "curve.json"
    slow.parent.mkdir(parents=True)
    slow.write_text(json.dumps([{"updates": 1500, "valid_bleu": 2.0, "train_seconds": 2500.0},
                                {"updates": 1250, "valid_bleu": 1.0, "train_seconds": 900.0}]))
    runner = Runner(tmp_path / "study", reuse=(tmp_path / "results.json",), hours=1.0)
    assert runner.estimate(plan[0], {}) == pytest.approx(1800) and runner.estimate(plan[2], {}) == pytest.approx(1800)
    assert runner.estimate(plan[4], {}) == pytest.approx(5000)
    runner.run(plan)
    assert calls == ["short", "begun"] and runner.held == {"long": pytest.approx(7200), "other": None,
                                                          "slow": pytest.approx(5000)}
    assert [hours(s) for s in (7200, 1800, 30, None)] == ["2.0 h", "30 min", "1 min", "unknown"]
    calls.clear()
    Runner(tmp_path / "study", reuse=(tmp_path / "results.json",)).run(plan)  # no limit: the rest runs
    assert calls == ["long", "other", "slow"]


def test_the_plan_estimates_a_set_whose_teacher_has_not_trained_from_the_teacher_s_planned_shape(tmp_path):
    """--hours' plan: a set's rate goes by its teacher's shape; a teacher still to train lends its planned
    settings, so its set is estimated (here 0.1 s a sentence times 2,000 pairs) and not 'unknown'."""
    from nat_kd.study.__main__ import plan_estimates

    shape = {"layers": 3, "embed_dim": 256}
    training = {"updates": 1000, "max_tokens": 4096, "bleu_every": 250}
    decoding = {"beam": 5}

    def record(name, kind, settings, wall, result):
        return {"name": name, "kind": kind, "settings": settings, "deps": [], "digest": "d", "fingerprint": "f",
                "wall_seconds": wall, "threads": 1, "result": {"outputs": [], **result}}

    def teacher_settings(layers):
        return {"arch": "transformer", "shape": {**shape, "layers": layers}, "training": training}

    def set_settings(teacher):
        return {"prepare": "prepare", "teacher": teacher, "strategy": "beam", "decoding": decoding, "max_tokens": 8000}

    committed = {"teacher.old": record("teacher.old", "train", teacher_settings(3), 3600.0, {"updates_trained": 1000}),
                 "distil.old": record("distil.old", "distil", set_settings("teacher.old"), 300.0, {"sentences": 3000})}
    (tmp_path / "results.json").write_text(json.dumps({"steps": committed}))
    prepare = Step("prepare", "prepare", {"pairs": 2000}, lambda ctx: {"outputs": [], "train_pairs": 2000})
    runner = Runner(tmp_path / "study", reuse=(tmp_path / "results.json",))
    runner.run([prepare])

    def plan(layers):
        teacher = Step("teacher.new", "train", teacher_settings(layers), lambda ctx: {"outputs": []})
        distil = Step("distil.new.beam", "distil", set_settings("teacher.new"), lambda ctx: {"outputs": []},
                      deps=["prepare", "teacher.new"])
        return [prepare, teacher, distil]

    assert plan_estimates(runner, plan(3)) == ["to run  teacher.new  1.0 h", "to run  distil.new.beam  3 min"]
    # a teacher of another shape: no set of its shape was timed
    assert plan_estimates(runner, plan(6))[1] == "to run  distil.new.beam  unknown"


def test_a_da_transformer_record_from_before_its_glancing_changed_stands_in_for_nothing(tmp_path):
    """The committed capacity study's DA-Transformer trained with the glancing of before (floor rounding, no
    force-emit): its step's settings now carry the family's recipe, so its record no longer matches, while the
    vanilla NAT's, whose training did not change, still does."""
    from nat_kd.engine.runner import ReusedRecords, inputs_key
    from nat_kd.engine.steps import settings_as_read

    results = Path(__file__).resolve().parents[1] / "docs" / "results" / "capacity" / "results.json"
    committed = json.loads(results.read_text())["steps"]
    reused = ReusedRecords(results, settings_as_read)
    steps = {s.name: s for s in build_plan(study_config.load("capacity"), tmp_path)}

    def found(name):
        step = steps[name]
        return reused.find(inputs_key(step.kind, settings_as_read(step.kind, step.settings),
                                      {d: committed[d]["digest"] for d in step.deps}))

    assert "recipe" not in steps["student.nat.real"].settings and found("student.nat.real") is not None
    assert steps["student.dat.real"].settings["recipe"] == 2 and found("student.dat.real") is None


def test_a_student_s_settings_hold_only_what_its_training_reads(tmp_path):
    """Vanilla NAT has no glancing schedule and the CTC and DAG losses no label smoothing: changing the profile's
    value for either leaves those students' settings, and so their fingerprints and checkpoints, as they were."""
    from dataclasses import replace

    cfg = study_config.load("capacity")

    def trainings(**changed):
        changed_cfg = replace(cfg, student_training=replace(cfg.student_training, **changed))
        return {family: s.settings["training"] for s in build_plan(changed_cfg, tmp_path)
                for family in ("nat", "glat", "glat_ctc", "dat") if s.name == f"student.{family}.real"}

    base = trainings()
    assert "glance_anneal_updates" not in base["nat"]
    assert [base[f]["glance_anneal_updates"] for f in ("glat", "glat_ctc", "dat")] == [1333, 1333, 1333]
    assert [base[f]["label_smoothing"] for f in ("nat", "glat", "glat_ctc", "dat")] == [0.1, 0.1, 0.0, 0.0]
    smoothed, annealed = trainings(label_smoothing=0.2), trainings(glance_anneal_updates=999)
    assert [smoothed[f] == base[f] for f in ("nat", "glat", "glat_ctc", "dat")] == [False, False, True, True]
    assert [annealed[f] == base[f] for f in ("nat", "glat", "glat_ctc", "dat")] == [True, False, False, False]


@pytest.mark.parametrize("profile", ["decoding", "students"])
def test_a_profile_shares_the_kd_effect_teacher_and_beam_set(profile, tmp_path):
    """Same settings and dependencies, so the same fingerprints: --reuse runs/study/kd-effect skips them."""
    plans = {name: {s.name: s for s in build_plan(study_config.load(name), tmp_path)}
             for name in ("kd-effect", profile)}
    for step in ("prepare", "teacher.converged", "distil.converged.beam"):
        kd, other = plans["kd-effect"][step], plans[profile][step]
        assert (kd.kind, kd.settings, kd.deps) == (other.kind, other.settings, other.deps), step
    if profile == "decoding":  # stopped on validation, where kd-effect trains a fixed budget
        assert plans["kd-effect"]["student.nat.real"].settings != plans[profile]["student.nat.real"].settings
    else:  # kd-effect's student settings, so the gains compare with its NAT's and CMLM's
        kd_student = plans["kd-effect"]["student.nat.real"].settings
        assert "glance_anneal_updates" not in kd_student["training"]  # a default left out: the same fingerprint
        for family, smoothing in [("glat", 0.1), ("glat_ctc", 0.0), ("dat", 0.0)]:
            mine = dict(plans[profile][f"student.{family}.real"].settings)
            # the DA-Transformer's version of its training (steps.RECIPES) is the only other setting
            assert mine.pop("recipe", None) == (2 if family == "dat" else None)
            # and the glancing schedule of the 2,000 updates, and no label smoothing where the loss has none
            mine["training"] = dict(mine["training"])
            assert mine["training"].pop("glance_anneal_updates") == 1333
            assert mine["training"].pop("label_smoothing") == smoothing
            mine["training"]["label_smoothing"] = kd_student["training"]["label_smoothing"]
            assert {k: v for k, v in mine.items() if k != "arch" and k != "nat_family"} == \
                {k: v for k, v in kd_student.items() if k != "arch" and k != "nat_family"}
        assert set(plans[profile]["speed"].settings["systems"]) == {
            "teacher converged beam", "glat on converged.beam", "glat_ctc on converged.beam", "dat on converged.beam"}


def test_the_capacity_profile_shares_the_students_run_teacher_beam_set_and_students(tmp_path):
    """The `students` run's folder (docs/results/students/config.toml) counts for the converged teacher, its beam
    set and the six students on the real data and on that set: the same settings and dependencies."""
    from conftest import ROOT

    plans = {name: {s.name: s for s in build_plan(study_config.load(path), tmp_path)}
             for name, path in [("students", ROOT / "docs/results/students/config.toml"), ("capacity", "capacity")]}
    shared = ["prepare", "teacher.converged", "distil.converged.beam"] + [
        f"student.{family}.{data}" for family in ("glat", "glat_ctc", "dat") for data in ("real", "converged.beam")]
    for step in shared:
        theirs, mine = plans["students"][step], plans["capacity"][step]
        assert (theirs.kind, theirs.settings, theirs.deps) == (mine.kind, mine.settings, mine.deps), step
    sets = ["real", "small.beam", "converged.beam", "converged.topk"]
    assert {f"student.{f}.{d}" for f in ("nat", "glat", "glat_ctc", "dat") for d in sets} <= set(plans["capacity"])
    assert plans["capacity"]["distil.small.beam"].deps == ["prepare", "teacher.small"]


@pytest.mark.parametrize("extra, message", [
    ("[[mixes]]\nname = 'm'\nof = 'zz.beam'\nrepeated = true\n", "of = 'zz.beam' is not a distilled set"),
    ("[[mixes]]\nname = 'm'\nof = 'a.beam'\nrepeat = true\n", "unknown key(s) repeat"),
    ("[[mixes]]\nname = 'real'\nof = 'a.beam'\nrepeated = true\n", "names must differ"),
    ("[students]\nseeds = [1, 2]\nseed_sets = ['real']\n", "other than 1"),
    ("[students]\nseeds = [2]\n", "seeds and seed_sets go together"),
    ("[students]\nseeds = [2]\nseed_sets = ['a.nucleus']\n", "'a.nucleus' is not a training set"),
    ("[students]\nseeds = [2]\nseed_sets = {glat = ['real']}\n", "seed_sets.glat: not one of [students].families"),
    ("[students]\nseeds = [2]\nseed_sets = {nat = ['a.nucleus']}\n", "'a.nucleus' is not a training set"),
    ("[students]\nseeds = [2]\nseed_sets = {nat = 'real'}\n", "expected a list of training sets"),
    ("[speed]\ndata = 'a.beam'\nstudents = ['gpt']\n", "unknown 'gpt'"),
    ("[speed]\ndata = 'a.beam'\nbatchings = ['batch:4']\n", "'batch:4' is not 'sentences:N' or 'tokens:N'"),
    ("[speed]\ndata = 'a.beam'\nteacher_strategies = ['sampling']\n", "choose from 'beam', 'greedy'"),
    ("[training_speed]\ndata = 'real'\n", "[training_speed]: missing key 'families'"),
    ("[training_speed]\nfamilies = ['nat', 'nat']\ndata = 'real'\n", "name each student family once"),
    ("[training_speed]\nfamilies = ['glat', 'gpt']\ndata = 'real'\n", "unknown 'gpt'"),
    ("[training_speed]\nfamilies = ['nat']\ndata = 'a.nucleus'\n", "'a.nucleus' is not a training set"),
    ("[training_speed]\nfamilies = ['nat']\ndata = 'real'\nupdates = 15\n", "updates = 15: at least 20"),
])
def test_mix_seed_and_speed_errors_name_the_key(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        study_config.load(_write(tmp_path, MINIMAL + extra))


def test_seed_sets_by_family_train_each_family_its_own_extra_seeds(tmp_path):
    """A list gives every family's seeds the same sets; a table gives each named family its own, and the
    families it leaves out no extra seed."""
    shared = study_config.load(_write(tmp_path, MINIMAL + "[students]\nseeds = [2]\nseed_sets = ['real']\n"))
    assert {s.name for s in build_plan(shared, tmp_path) if ".seed" in s.name} == {
        "student.nat.real.seed2", "student.cmlm.real.seed2"}
    own = study_config.load(_write(tmp_path, MINIMAL + "[students]\nseeds = [2]\n"
                                   "seed_sets = {cmlm = ['a.beam', 'real']}\n"))
    steps = {s.name: s for s in build_plan(own, tmp_path)}
    assert {name for name in steps if ".seed" in name} == {"student.cmlm.a.beam.seed2", "student.cmlm.real.seed2"}
    assert steps["student.cmlm.a.beam.seed2"].settings["seed"] == 2
    assert steps["student.cmlm.a.beam.seed2"].deps == ["prepare", "distil.a.beam"]


def test_training_speed_takes_turns_and_reports_the_median_ratio(tmp_path, monkeypatch):
    from nat_kd.engine import fairseq_jobs
    from nat_kd.engine.steps import training_speed_step
    from nat_kd.engine.runner import Step, StepContext

    speeds = {"nat": iter([1.0, 2.0, 1.0]), "dat": iter([0.5, 0.5, 0.4])}  # dat: 0.5, 0.25, 0.4 of nat
    order = []

    def fake(bin_dir, save_dir, *, nat_family, **kwargs):
        order.append(nat_family)
        return next(speeds[nat_family])

    monkeypatch.setattr(fairseq_jobs, "training_speed", fake)
    (tmp_path / "bin").mkdir()
    ctx = StepContext(Step("training_speed", "speed", {}, None, []), tmp_path, tmp_path / "log",
                      {"prepare": {"dir": str(tmp_path)}}, threads=1)
    out = training_speed_step(ctx, prepare="prepare", data=None, families=["nat", "dat"],
                              shape={"embed_dim": 8, "ffn_dim": 8, "layers": 1, "heads": 1},
                              training={"updates": 1}, updates=20, repeats=3)
    assert order == ["nat", "dat", "dat", "nat", "nat", "dat"]
    assert out["ratio"] == {"nat": 1.0, "dat": 0.4} and out["baseline"] == "nat"


def test_decoding_speed_takes_turns_and_reports_the_median_ratio_per_batching(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from nat_kd.engine import fairseq_jobs, steps
    from nat_kd.engine.runner import Step, StepContext

    # sentences/s by (system, batching), one value a round: nat is 4, 2, 10 times beam at batch size 1
    speeds = {("beam", "sentences1"): iter([1.0, 2.0, 1.0]), ("nat", "sentences1"): iter([4.0, 4.0, 10.0]),
              ("beam", "tokens4096"): iter([10.0, 10.0, 10.0]), ("nat", "tokens4096"): iter([30.0, 20.0, 50.0])}
    order = []

    def translate(bin_dir, checkpoint, split, hypotheses, **kwargs):
        order.append((checkpoint.name, hypotheses.name.split(".")[1]))
        return ["a"]

    monkeypatch.setattr(fairseq_jobs, "translate", translate)
    monkeypatch.setattr(fairseq_jobs, "generation_speed",
                        lambda log: {"sentences_per_second": next(speeds[order[-1]])})
    monkeypatch.setattr(fairseq_jobs, "bleu", lambda lines, refs: {"bleu": 1.0})
    monkeypatch.setattr(steps, "read_lines", lambda path: ["a"])
    monkeypatch.setattr(steps, "PreparedCorpus", lambda d: SimpleNamespace(
        raw=lambda split, lang: None, bin=SimpleNamespace(root=tmp_path), tokenization=lambda: None,
        language_pair=lambda: None))
    results = {"prepare": {"dir": str(tmp_path)}, "t": {"checkpoint": "beam"}, "s": {"checkpoint": "nat"}}
    ctx = StepContext(Step("speed", "speed", {}, None, []), tmp_path, tmp_path / "log", results, threads=1)
    out = steps.speed_step(ctx, prepare="prepare", systems={"beam": {"step": "t"}, "nat": {"step": "s"}},
                          batchings=["sentences:1", "tokens:4096"], repeats=3, evaluation={"beam": 1}, tgt="de")
    assert [name for name, _ in order] == ["beam", "nat", "beam", "nat",  # round 1 in plan order,
                                           "nat", "beam", "nat", "beam",  # round 2 reversed
                                           "beam", "nat", "beam", "nat"]
    assert out["speedup"] == {"beam|sentences:1": 1.0, "nat|sentences:1": 4.0,
                              "beam|tokens:4096": 1.0, "nat|tokens:4096": 3.0}


def test_fairseq_training_speed_is_read_from_its_own_reports(tmp_path, monkeypatch):
    from nat_kd.engine import fairseq_jobs
    from fairseq_plugins.models.sizes import ModelSize
    from nat_kd.engine.training import Training

    log = tmp_path / "log"
    log.write_text("INFO:train_inner:epoch 001: 10 / 9 loss=3, ups=9.0, wpb=1\n")  # an earlier run's

    def fake_run(module, args, log_path, threads, device=None):
        assert "--no-save" in args and args[args.index("--max-update") + 1] == 30 and threads == 1
        with open(log_path, "a") as handle:
            for ups in ("0.20", "0.60", "0.70", "0.80"):  # the first is start-up
                handle.write(f"INFO:train_inner:epoch 001:     10 / 141 loss=7.6, ppl=196.2, ups={ups}, wpb=3440\n")

    monkeypatch.setattr(fairseq_jobs, "run_logged", fake_run)
    ups = fairseq_jobs.training_speed(tmp_path, tmp_path, arch="a", shape=ModelSize(8, 8, 1, 1),
                                      training=Training(updates=1), nat_family="nat", updates=30, interval=10, log=log)
    assert ups == 0.7


def test_updates_per_second_is_the_median_chunk_rate():
    from nat_kd.study.gains import updates_per_second

    curve = [{"updates": 250, "train_seconds": 100.0}, {"updates": 500, "train_seconds": 50.0},
             {"updates": 750, "train_seconds": 500.0}, {"updates": 1000, "train_seconds": 0.0}]  # measured earlier
    assert updates_per_second(curve) == 2.5  # median of 2.5, 5 and 0.5
    assert updates_per_second([]) is None


def test_gains_table_sets_each_student_against_its_family_on_the_real_data(tmp_path):
    from nat_kd.study.gains import gains_section

    cfg = study_config.load(_write(tmp_path, MINIMAL))  # families nat and cmlm
    (tmp_path / "prep" / "raw").mkdir(parents=True)
    references = [f"a man number {i} rides a red bike down the hill" for i in range(40)]
    (tmp_path / "prep" / "raw" / "test.de").write_text("\n".join(references) + "\n")

    def student(name, lines, bleu, curve):
        path = tmp_path / f"{name}.hyp"
        path.write_text("\n".join(lines) + "\n")
        return {"test_bleu": bleu, "test_hypotheses": str(path), "curve": curve, "updates_trained": curve[-1]["updates"]}

    curve = [{"updates": 250, "train_seconds": 125.0}, {"updates": 500, "train_seconds": 250.0}]
    res = {"prepare": {"dir": str(tmp_path / "prep")},
           "student.nat.real": student("real", ["a dog"] * 40, 10.0, curve),
           "student.nat.a.beam": student("beam", references, 60.0, curve),
           "student.cmlm.real": student("cmlm", references, 50.0, curve)}  # no other cmlm student: no row
    text = "".join(gains_section(cfg, res))
    assert "| nat | real | 10.00 | - | baseline | 1.50 | 500 |" in text  # median of 2.0 and 1.0 updates/s
    row = next(line for line in text.splitlines() if line.startswith("| nat | a.beam |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:4] == ["60.00", "+50.00"] and float(cells[4]) < 0.01  # the reference itself beats "a dog"
    assert "| cmlm |" not in text
    assert gains_section(cfg, {"prepare": res["prepare"], "student.nat.real": res["student.nat.real"]}) == []


@pytest.mark.parametrize("methods, rendered", [("[]", False), ('["greedy"]', True)])
def test_the_central_table_needs_two_distilled_sets_to_choose_from(tmp_path, methods, rendered):
    from nat_kd.study.central_table import central_section

    cfg = study_config.load(_write(tmp_path, MINIMAL + f"[distill]\nmethods = {methods}\n"))
    measures = {"complexity": 0.7, "complexity_token_weighted": 0.8, "faithfulness": 1.0, "reordering": 0.8}
    res = {"analysis": {"rows": [{"name": label, **measures} for label in cfg.data_labels()]},
           "student.nat.real": {"valid_bleu": 11.0, "test_bleu": 10.0}}
    text = "".join(central_section(cfg, res, tmp_path, {}))
    assert ("## The central table" in text) == rendered
    if rendered:
        assert [line.split(" |")[0] for line in text.splitlines() if line.startswith("| a.")] == ["| a.beam",
                                                                                                "| a.greedy"]
        assert "| real | reference | 0.700 | 0.800 | 1.000 |" in text


def test_spearman_p_value_is_exact_over_every_pairing():
    from nat_kd.study.central_table import spearman

    # 4 sets in the same order: 2 of the 24 pairings (this one and its reverse) reach |rho| = 1
    rho, p = spearman([0.1, 0.2, 0.3, 0.4], [10, 11, 12, 13])
    assert rho == pytest.approx(1.0) and p == pytest.approx(2 / 24)
    rho, p = spearman([4, 3, 2, 1], [1.0, 2.0, 3.0, 4.0])
    assert rho == pytest.approx(-1.0) and p == pytest.approx(2 / 24)
    # one swap: rho = 1 - 6 * 2 / (4 * 15) = 0.8; pairings with |rho| >= 0.8: the 3 adjacent swaps, the
    # identity, and their 4 reverses
    rho, p = spearman([1, 2, 3, 4], [1, 3, 2, 4])
    assert rho == pytest.approx(0.8) and p == pytest.approx(8 / 24)


def test_the_same_outputs_in_another_study_folder_have_the_same_digests(tmp_path):
    """A step's digest is its outputs' names and bytes, so the same steps run in two folders chain to the same
    fingerprints (what --reuse matches on), and a changed byte changes it."""
    def run(ctx):
        out = ctx.work / "out.txt"
        out.write_text(f"{ctx.step.settings}")
        return {"outputs": [str(out)]}

    plan = [Step("a", "k", {"x": 1}, run), Step("b", "k", {"y": 1}, run, ["a"])]
    first, second = Runner(tmp_path / "first").run(plan), Runner(tmp_path / "elsewhere" / "second").run(plan)
    for name in ("a", "b"):
        assert (first[name]["fingerprint"], first[name]["digest"]) == (second[name]["fingerprint"], second[name]["digest"])
    changed = [Step("a", "k", {"x": 1}, lambda ctx: (ctx.work / "out.txt").write_text("other") and
                    {"outputs": [str(ctx.work / "out.txt")]}), plan[1]]
    third = Runner(tmp_path / "third").run(changed)
    assert third["a"]["digest"] != first["a"]["digest"] and third["b"]["fingerprint"] != first["b"]["fingerprint"]


def test_small_exact_p_values_keep_their_digits():
    from nat_kd.study.central_table import p_value_cell

    assert p_value_cell(2 / 5040) == "4.0e-04"  # a perfect order of 7 sets
    assert p_value_cell(0.048) == "0.048"
    assert p_value_cell(0.001) == "0.001"
    assert p_value_cell(float("nan")) == "-"


def test_spearman_over_eight_sets_counts_the_8_factorial_orders_only():
    """The study's 8 training sets: 40,320 orders (not 40,320 squared, which would not fit in memory)."""
    import tracemalloc

    from nat_kd.study.central_table import spearman

    tracemalloc.start()
    rho, p = spearman(list(range(8)), [float(v) for v in range(8)])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rho == pytest.approx(1.0) and p == pytest.approx(2 / 40320)
    assert peak < 200e6


def test_spearman_over_eleven_sets_stays_bounded_and_draws_random_orders():
    """11! = 39,916,800 orders would not fit in memory at once: above 9 sets, 100,000 seeded random orders (a
    perfect order is then beaten by none of them: p = 2 / 100,001); the exact count stops at 9 sets."""
    import tracemalloc

    from nat_kd.study.central_table import spearman

    tracemalloc.start()
    rho, p = spearman(list(range(11)), [float(v) for v in range(11)])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rho == pytest.approx(1.0) and p == pytest.approx(2 / 100_001) and peak < 200e6
    assert spearman(list(range(11)), [float(v) for v in range(11)]) == (rho, p)  # seeded: the same p each time
    assert spearman(list(range(9)), [float(v) for v in range(9)])[1] == pytest.approx(2 / 362_880)


def test_the_family_table_finds_each_family_s_best_set_and_tests_the_others_against_it(tmp_path):
    """Four families on four sets, by hand: each family's best set, the gaps and paired bootstrap p against
    it, the seed spread, the rank correlations (exact p of a perfect order of 4: 2/24) and the figure."""
    from dataclasses import replace

    from nat_kd.study.family_table import family_section

    cfg = replace(study_config.load("capacity"), student_seeds=(2,), seed_sets={"nat": ("small.beam",)})
    sets = ["real", "small.beam", "converged.beam", "converged.topk"]
    complexity = {"real": 1.07, "small.beam": 0.70, "converged.beam": 0.80, "converged.topk": 0.95}
    references = [f"ein hund nummer {i} läuft über die wiese" for i in range(30)]
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "test.de").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    res = {"prepare": {"dir": str(tmp_path / "data")},
           "analysis": {"rows": [{"name": s, "complexity": 0.7 + i / 10, "complexity_token_weighted": complexity[s],
                                  "reordering": 0.8 + i / 100, "bleu": 100 - 10 * i} for i, s in enumerate(sets)]}}
    # nat: the simpler the better (small.beam best); dat: the more complex the better (real best)
    bleu = {"nat": {"small.beam": 20.0, "converged.beam": 19.0, "converged.topk": 17.0, "real": 15.0},
            "glat": {"small.beam": 19.0, "converged.beam": 20.0, "converged.topk": 18.0, "real": 16.0},
            "glat_ctc": {"small.beam": 21.0, "converged.beam": 22.0},
            "dat": {"small.beam": 25.0, "converged.beam": 26.0, "converged.topk": 27.0, "real": 28.0}}
    for family, scores in bleu.items():
        for label, score in scores.items():
            hyps = tmp_path / f"{family}.{label}.hyp"
            best = score == max(scores.values())
            # the best set's student says every reference; the others say nothing of a third of them
            hyps.write_text("".join((r if best or i % 3 else "nichts") + "\n" for i, r in enumerate(references)),
                            encoding="utf-8")
            res[f"student.{family}.{label}"] = {"test_bleu": score, "test_hypotheses": str(hyps)}
    res["student.nat.small.beam.seed2"] = {"test_bleu": 19.0}
    paths = {}
    text = "\n".join(family_section(cfg, res, tmp_path, paths))
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.split("###")[0].splitlines()
            if line.startswith("| ") and line.split(" | ")[0].strip("| ") in bleu}
    assert rows["nat"][2] == "**20.00** (best)" and rows["nat"][-2:] == ["small.beam", "0.700 |"]
    assert rows["dat"][1] == "**28.00** (best)" and rows["dat"][-2:] == ["real", "1.070 |"]
    assert rows["glat_ctc"][1] == "-" and rows["glat_ctc"][-2] == "converged.beam"
    gap, p = re.fullmatch(r"15\.00 \((-5\.00), p ([0-9.]+)\)", rows["nat"][1]).groups()
    assert 0 <= float(p) < 0.05  # a third of the sentences lost against the best: far beyond chance
    assert "| nat | small.beam | 20.00, 19.00 | 19.50 | 0.71 | 1.00 |" in text
    correlations = text.split("### Do the data measures predict", 1)[1]
    weighted = next(line for line in correlations.splitlines() if line.startswith("| C(d), token-weighted"))
    # glat_ctc has two sets: no correlation; nat falls with complexity, dat rises, both perfectly
    assert weighted == "| C(d), token-weighted | -1.00 (0.083) | -0.80 (0.333) | +1.00 (0.083) |"
    assert "glat_ctc (n" not in correlations.split("\n\n")[0]
    assert paths["family_figure"].is_file() and paths["family_figure"].stat().st_size > 10_000
    assert family_section(replace(cfg, student_families=("nat",)), res, tmp_path, {}) == []
    # without the detailed analysis (the `cpu` profile's) there is no token-weighted C(d): the table, no figure
    for row in res["analysis"]["rows"]:
        del row["complexity_token_weighted"]
    paths = {}
    text = "\n".join(family_section(cfg, res, tmp_path / "plain", paths))
    assert "| nat | 15.00 (-5.00, p" in text and "No figure of BLEU against token-weighted C(d)" in text
    assert "family_figure" not in paths and not (tmp_path / "plain").exists()


@pytest.mark.slow
def test_the_job_server_keeps_fairseqs_import_noise_off_the_terminal_and_its_info_lines_in_the_log(tiny_en_de,
                                                                                                 tmp_path):
    """A fresh driver's job server imports fairseq, whose text_to_speech task logs "Please install tensorboardX"
    as it is imported, and composes a hydra config, which logs; the driver's terminal shows nothing of it, and
    the job's log keeps fairseq-train's INFO lines (its progress, which the study reads)."""
    import subprocess
    import sys

    from conftest import MICRO_MODEL, ROOT

    log = tmp_path / "train.log"
    args = [str(tiny_en_de / "bin"), "--user-dir", str(ROOT / "fairseq_plugins"), "--arch", "kd_transformer_tiny",
            *MICRO_MODEL, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1024", "--max-update", "2",
            "--required-batch-size-multiple", "1", "--save-dir", str(tmp_path / "ckpt"), "--no-save",
            "--disable-validation", "--log-format", "simple", "--log-interval", "1", "--no-progress-bar"]
    code = ("import sys; from pathlib import Path; from nat_kd.cli import setup_logging; setup_logging([]); "
            "from nat_kd.engine import fairseq_jobs; "
            f"fairseq_jobs.run_logged('fairseq_cli.train', {args!r}, Path({str(log)!r}), 1)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout + proc.stderr == ""  # neither tensorboardX's note nor the server's hydra composing
    text = log.read_text()
    assert "INFO:fairseq_cli.train:done training" in text and "num_updates 2" in text


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_a_curve_chunk_killed_after_an_epoch_s_end_trains_again_as_it_ran(tiny_en_de, tmp_path):
    """A learning curve's second chunk whose job dies midway (kill -9, here right after the end of epoch 2)
    resumes from the first chunk's end to the very model of a curve never killed. Had fairseq saved at the
    epoch's end, the rerun would resume there and group the batches anew: another model (the `students` and
    `capacity` runs' DA-Transformer on the real data differed by 0.48 test BLEU so)."""
    import subprocess

    import torch

    from conftest import ROOT
    from nat_kd.engine import fairseq_jobs
    from fairseq_plugins.models.sizes import ModelSize
    from nat_kd.engine.training import Training

    # about 5 updates an epoch: the first chunk ends in epoch 2, the second ends in epoch 3
    model = dict(arch="kd_transformer_tiny", shape=ModelSize(32, 64, 1, 2), nat_family=None)
    chunks = [Training(updates=updates, max_tokens=2048, warmup=4, bleu_every=6) for updates in (6, 14)]

    def train(name, chunk):
        fairseq_jobs.train(tiny_en_de / "bin", tmp_path / name, **model, training=chunk, log=tmp_path / f"{name}.log",
                           threads=1)

    for name in ("killed", "whole"):
        train(name, chunks[0])
    args = [str(a) for a in fairseq_jobs.train_args(tiny_en_de / "bin", tmp_path / "killed", **model,
                                                    training=chunks[1], log_interval=1)]
    killed = ("import os, sys; import fairseq_cli.train as t; save = t.validate_and_save\n"
              "def dies_after_epoch_2(cfg, trainer, task, epoch_itr, subsets, end_of_epoch):\n"
              "    out = save(cfg, trainer, task, epoch_itr, subsets, end_of_epoch)\n"
              "    if end_of_epoch and epoch_itr.epoch == 2:\n"
              "        print('killed at update', trainer.get_num_updates(), flush=True); os._exit(137)\n"
              "    return out\n"
              f"t.validate_and_save = dies_after_epoch_2; sys.argv = ['fairseq-train', *{args!r}]; t.cli_main()\n")
    run = subprocess.run([sys.executable, "-c", killed], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 137, run.stdout[-2000:] + run.stderr[-2000:]
    assert 6 < int(run.stdout.split("killed at update")[1].split()[0]) < 14  # midway through the second chunk
    for name in ("killed", "whole"):  # the rerun of the killed chunk; a chunk never killed
        train(name, chunks[1])
    killed, whole = (torch.load(tmp_path / name / "checkpoint_last.pt", weights_only=True)
                     for name in ("killed", "whole"))
    assert killed["optimizer_history"][-1]["num_updates"] == whole["optimizer_history"][-1]["num_updates"] == 14
    assert killed["model"].keys() == whole["model"].keys()
    assert all(torch.equal(killed["model"][k], whole["model"][k]) for k in whole["model"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the job's end with its server is Linux's prctl")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
@pytest.mark.slow
def test_a_job_ends_with_the_driver_that_started_it(sig, tiny_en_de, tmp_path):
    """A driver stopped by a signal only it receives (a kill of its pid, -9 included) takes its running job
    with it: left running, the job would train beside the rerun that resumes the same step."""
    import signal
    import subprocess
    import time

    from conftest import MICRO_MODEL, ROOT, process_running

    log = tmp_path / "train.log"
    args = [str(tiny_en_de / "bin"), "--user-dir", str(ROOT / "fairseq_plugins"), "--arch", "kd_transformer_tiny",
            *MICRO_MODEL, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1024", "--max-update", "1000000",
            "--required-batch-size-multiple", "1", "--save-dir", str(tmp_path / "ckpt"), "--no-save",
            "--disable-validation", "--log-format", "simple", "--log-interval", "1", "--no-progress-bar",
            "--num-workers", "0"]  # as the study's jobs (train_args)
    code = ("from pathlib import Path; from nat_kd.engine import fairseq_jobs; "
            f"fairseq_jobs.run_logged('fairseq_cli.train', {args!r}, Path({str(log)!r}), 1)")
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    job = None
    try:
        deadline = time.time() + 120
        while "num_updates=1," not in (log.read_text() if log.exists() else ""):  # the job is training
            assert driver.poll() is None and time.time() < deadline, log.read_text() if log.exists() else ""
            time.sleep(0.2)
        (job,) = [child for server in _children(driver.pid) for child in _children(server)]
        driver.send_signal(getattr(signal, sig))
        driver.wait(timeout=30)
        deadline = time.time() + 30
        while process_running(job):
            assert time.time() < deadline, f"the job {job} trains on after its driver's {sig}"
            time.sleep(0.2)
    finally:
        for pid in [driver.pid] + ([job] if job else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        driver.wait()


def _ladder_records(bleu: dict[str, list[float]], seeds: dict[tuple[str, str], float] = {}) -> dict:
    """The records a ladder study leaves: four teachers, their beam sets' analysis, each family's students."""
    teachers = {"tiny": (516_480, 25.1), "small": (1_950_720, 35.3), "medium": (7_579_648, 34.5),
                "base": (48_238_592, 36.0)}
    complexity = {"tiny": (0.65, 0.70), "small": (0.69, 0.78), "medium": (0.71, 0.81), "base": (0.72, 0.84)}
    res = {f"teacher.{t}": {"parameters": p, "test_bleu": b} for t, (p, b) in teachers.items()}
    res["analysis"] = {"rows": [{"name": "real", "complexity": 0.69, "complexity_token_weighted": 1.07}]
                       + [{"name": f"{t}.beam", "complexity": c, "complexity_token_weighted": w}
                          for t, (c, w) in complexity.items()]}
    for family, values in bleu.items():
        res[f"student.{family}.real"] = {"test_bleu": 15.0}
        for t, b in zip(teachers, values):
            res[f"student.{family}.{t}.beam"] = {"test_bleu": b}
    for (family, data), b in seeds.items():
        res[f"student.{family}.{data}.seed2"] = {"test_bleu": b}
    return res


def test_the_ladder_section_reads_the_papers_two_claims_from_the_curves(tmp_path):
    """Hand-made curves: vanilla NAT peaks on the small teacher's set and falls by more than the noise of its
    seeds on both sides, GLAT peaks on the medium one, the DA-Transformer only rises; the peaks' C(d) rise
    with the family's strength."""
    from dataclasses import replace

    from nat_kd.study.ladder import ladder_section

    cfg = study_config.load("ladder")
    cfg = replace(cfg, student_seeds=(2,), seed_sets={"nat": ("small.beam", "medium.beam")})
    res = _ladder_records({"nat": [17.0, 19.5, 19.0, 16.5], "glat": [16.0, 18.0, 18.6, 18.4],
                           "dat": [26.0, 27.0, 27.5, 28.0]},
                          seeds={("nat", "small.beam"): 19.1, ("nat", "medium.beam"): 19.8})
    paths = {}
    text = "\n".join(ladder_section(cfg, res, tmp_path, paths))
    assert paths["ladder_figure"].stat().st_size > 10_000
    assert "| nat | 17.00 | **19.50** | 19.00 | 16.50 | 15.00 | small |" in text
    assert "| dat | 26.00 | 27.00 | 27.50 | **28.00** | 15.00 | base |" in text
    assert "| teacher's own test BLEU | 25.10 | 35.30 | 34.50 | 36.00 |" in text
    # nat's pooled seed sd: sqrt(((19.5-19.1)^2/2 + (19.0-19.8)^2/2) / 2) = sqrt((0.08 + 0.32) / 2) = 0.4472;
    # 2 sd of a difference: 2 * sqrt(2) * 0.4472 = 1.26; the seeds' means: small 19.30, medium 19.40
    assert ("- nat: rises then falls: +2.50 from the smallest teacher, -3.00 to the largest; beyond 2 seed sd of a "
            "difference (1.26) on both sides; the means of its seeds: small 19.30 (2), medium 19.40 (2), the highest "
            "of them on medium (pooled seed sd 0.45).") in text
    assert "- glat: rises then falls: +2.60 from the smallest teacher, -0.20 to the largest." in text
    assert "- dat: rises to the largest teacher." in text
    assert "further up the ladder" not in text  # dat's peak is the top of a whole ladder
    assert ("- C(d) token-weighted of each family's peak set, weakest first: nat small (0.780), glat medium "
            "(0.810), dat base (0.840): rises with the student's strength; Spearman rho +1.00 over 3 families.") in text
    # with the test outputs at hand, each cell's paired bootstrap against its family's peak, as sacrebleu has it
    from nat_kd.study.central_table import paired_bootstrap, p_value_cell

    (tmp_path / "prep" / "raw").mkdir(parents=True)
    references = ["ein Hund läuft im Park .", "zwei Männer spielen Fußball .", "eine Frau liest ein Buch .",
                  "ein Kind isst einen Apfel .", "die Sonne scheint hell ."]
    (tmp_path / "prep" / "raw" / "test.de").write_text("\n".join(references) + "\n")
    res["prepare"] = {"dir": str(tmp_path / "prep")}
    outputs = {}
    for i, t in enumerate(["tiny", "small", "medium", "base"]):
        outputs[t] = [ref if j <= i else "ein Mann ." for j, ref in enumerate(references)]
        (tmp_path / f"{t}.hyp").write_text("\n".join(outputs[t]) + "\n")
        res[f"student.nat.{t}.beam"]["test_hypotheses"] = str(tmp_path / f"{t}.hyp")
    expected = paired_bootstrap(outputs["small"], {t: outputs[t] for t in ("tiny", "medium", "base")}, references)
    text = "\n".join(ladder_section(cfg, res, tmp_path, {}))
    assert (f"| nat | 17.00 (p {p_value_cell(expected['tiny'])}) | **19.50** | 19.00 (p "
            f"{p_value_cell(expected['medium'])}) | 16.50 (p {p_value_cell(expected['base'])}) | 15.00 | small |") in text
    assert "| glat | 16.00 | 18.00 | **18.60** | 18.40 | 15.00 | medium |" in text  # no outputs: no p
    # a peak on the same set for a stronger family does not make the complexity rise
    res = _ladder_records({"nat": [17.0, 19.5, 19.0, 16.5], "glat": [16.0, 18.0, 17.6, 17.4],
                           "dat": [26.0, 27.0, 26.5, 26.0]})
    text = "\n".join(ladder_section(cfg, res, tmp_path, {}))
    assert "- C(d) paper of each family's peak set, weakest first: nat small (0.690), glat small (0.690), dat small " \
           "(0.690): does not rise with the student's strength." in text
    assert "Not yet on the ladder" not in text
    # three rungs: the base teacher untrained, and the medium one's set made but no student on it yet
    for key in ["teacher.base", *[f"student.{f}.base.beam" for f in ("nat", "glat", "dat")]]:
        del res[key]
    res["distil.medium.beam"] = {"bleu": 40.0}
    for family in ("nat", "glat"):
        del res[f"student.{family}.medium.beam"]
    res["student.nat.small.beam.seed2"] = {"test_bleu": 19.1}
    paths = {}
    text = "\n".join(ladder_section(cfg, res, tmp_path, paths))
    assert paths["ladder_figure"].stat().st_size > 10_000
    assert "| dat | 26.00 | **27.00** | 26.50 | - | 15.00 | small |" in text
    # nat and glat peak on the small set, the largest they have: their peaks may move up; dat's falls after it.
    # nat's lead over the tiny set against its one set with two seeds: sd sqrt(0.08) = 0.283, 2 sd of a
    # difference 0.80
    assert ("- nat: rises to the largest teacher; its lead over the next rung, +2.50, beyond 2 seed sd of a "
            "difference (0.80) (pooled seed sd 0.28).") in text
    assert ("- nat, glat: the peak is the largest teacher's set with a student, and the larger teachers' are not "
            "measured yet: the peak may lie further up the ladder.\n") in text
    assert ("**Not yet on the ladder** (the verdicts above are read without them):\n\n"
            "- base (6x512): its teacher has not finished training.\n"
            "- nat: no student yet on the set of medium (3x256).\n"
            "- glat: no student yet on the set of medium (3x256).\n") in text
    assert "- medium (3x256):" not in text  # dat learned from it
    # a family on fewer rungs than a curve needs is named, with the rungs it has
    dat = {k: res.pop(k) for k in ("student.dat.tiny.beam", "student.dat.small.beam")}
    text = "\n".join(ladder_section(cfg, res, tmp_path, {}))
    assert "| dat |" not in text
    assert "- dat: a student on 1 of the 4 teachers' sets, its curve drawn from 2.\n" in text
    res.update(dat)
    del res["student.dat.medium.beam"]
    text = "\n".join(ladder_section(cfg, res, tmp_path, {}))
    assert "- medium (3x256): no student has trained on its beam set.\n" in text
    del res["distil.medium.beam"]
    assert "- medium (3x256): its beam set has not been made.\n" in "\n".join(ladder_section(cfg, res, tmp_path, {}))
    # teachers of one shape are not a ladder
    same = replace(cfg, teachers=tuple(replace(t, shape=cfg.teachers[0].shape) for t in cfg.teachers))
    assert ladder_section(same, res, tmp_path, {}) == []


SEVERAL = """
[[teachers.models]]
name = "b"
embed_dim = 8
ffn_dim = 8
layers = 1
heads = 1
seed = 2
[distill]
methods = []
[[references]]
name = "ddrs"
of = ["a.beam", "b.beam"]
[[references]]
name = "ddrs-mean"
of = ["a.beam", "b.beam"]
selection = "per-token-mean"
[[references]]
name = "union"
of = ["a.beam", "b.beam"]
union = true
"""


def test_sets_of_several_references_and_the_sets_each_family_learns_from(tmp_path):
    """Teachers of one shape with other seeds, a multi-reference set of their beam sets under each selection,
    their union; the CTC student learns from the sets of several references, vanilla NAT from the rest."""
    text = MINIMAL + SEVERAL + '[students]\nfamilies = ["nat", "glat_ctc"]\nsets = {nat = ["real", "a.beam", ' \
                               '"union"]}\n'
    cfg = study_config.load(_write(tmp_path, text))
    steps = {s.name: s for s in build_plan(cfg, tmp_path)}
    assert steps["teacher.b"].settings["seed"] == 2 and "seed" not in steps["teacher.a"].settings
    ddrs = steps["references.ddrs"]
    assert ddrs.kind == "mix" and ddrs.deps == ["prepare", "distil.a.beam", "distil.b.beam"]
    assert ddrs.settings["criterion"] == {"references": 2, "reference_selection": "ddrs"}  # the schedule's defaults
    assert steps["references.ddrs-mean"].settings["criterion"]["reference_selection"] == "per-token-mean"
    assert steps["references.union"].settings["union"] is True and "criterion" not in steps["references.union"].settings
    # the analysis measures the union (a training set of its own pairs), not a multi-reference set (its first)
    assert steps["analysis"].deps == ["prepare", "distil.a.beam", "distil.b.beam", "references.union"]
    students = sorted(n for n in steps if n.startswith("student."))
    assert students == ["student.glat_ctc.a.beam", "student.glat_ctc.b.beam", "student.glat_ctc.ddrs",
                        "student.glat_ctc.ddrs-mean", "student.glat_ctc.real", "student.glat_ctc.union",
                        "student.nat.a.beam", "student.nat.real", "student.nat.union"]
    assert steps["student.glat_ctc.ddrs"].deps == ["prepare", "references.ddrs"]


def test_the_sets_table_names_how_a_set_of_several_references_and_a_union_are_made(tmp_path):
    from nat_kd.study.central_table import _rows
    from nat_kd.study.results import decoding_table

    text = MINIMAL + SEVERAL + '[students]\nfamilies = ["glat_ctc"]\n'
    cfg = study_config.load(_write(tmp_path, text))
    res = {"analysis": {"rows": [{"name": n, "complexity": 0.7} for n in ("real", "a.beam", "b.beam", "union")]}}
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in decoding_table(cfg, res).splitlines()[2:]}
    assert rows["ddrs"] == ["a, b", "2 references a line (a.beam, b.beam), ddrs"]
    assert rows["ddrs-mean"] == ["a, b", "2 references a line (a.beam, b.beam), per-token-mean"]
    assert rows["union"] == ["a, b", "union of a.beam, b.beam"]
    assert {r["label"]: r["strategy"] for r in _rows(cfg, res)}["union"] == "union of a.beam, b.beam"


@pytest.mark.parametrize("extra, message", [
    ('[students]\nfamilies = ["nat"]\n', "[students]: nat students take one reference a sentence, not the set(s) "
                                         "ddrs, ddrs-mean: give them their own sets"),
    ('[students]\nfamilies = ["glat_ctc"]\n[[references]]\nname = "x"\nof = ["a.beam"]\n',
     "[[references]] x: of = ['a.beam']: give two distilled sets or more"),
    ('[students]\nfamilies = ["glat_ctc"]\n[[references]]\nname = "x"\nof = ["a.beam", "c.beam"]\n',
     "[[references]] x: 'c.beam' is not a distilled set"),
    ('[students]\nfamilies = ["glat_ctc"]\n[[references]]\nname = "x"\nof = ["a.beam", "b.beam"]\nselection = "max"\n',
     "[[references]] x: selection = 'max': 'ddrs', 'per-token-min', 'per-token-mean'"),
    ('[students]\nfamilies = ["glat_ctc"]\n[[references]]\nname = "x"\nof = ["a.beam", "b.beam"]\nunion = true\n'
     'selection = "per-token-mean"\n', "[[references]] x: union = true makes one reference a line: drop selection"),
    ('[students]\nfamilies = ["glat_ctc"]\n[[references]]\nname = "x"\nof = ["a.beam", "b.beam"]\n'
     'selection = "per-token-min"\nddrs_max_update = 10\n', "[[references]] x: ddrs_max_update and "
                                                             "ddrs_save_interval_updates are DDRS's schedule"),
    ('[students]\nfamilies = ["dat"]\n', "[[references]] ddrs: selection = 'ddrs', which dat students do not take "
                                          "(per-token-min, per-token-mean)"),
    ('[students]\nfamilies = ["glat_ctc"]\n[[references]]\nname = "union"\nof = ["a.beam", "b.beam"]\n',
     "[[references]]: names must differ"),
])
def test_sets_of_several_references_are_checked(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        study_config.load(_write(tmp_path, MINIMAL + SEVERAL + extra))


def test_a_student_on_several_references_trains_with_the_loss_that_takes_them(tmp_path):
    from fairseq_plugins.models.sizes import ModelSize
    from nat_kd.engine import fairseq_jobs
    from nat_kd.engine.training import Training

    common = dict(arch="kd_glat_ctc_tiny", shape=ModelSize(8, 8, 1, 1), training=Training(updates=1))
    ddrs = {"references": 3, "reference_selection": "ddrs", "ddrs_max_update": 2000, "ddrs_save_interval_updates": 33}
    flags = fairseq_jobs.train_args(tmp_path, tmp_path, nat_family="glat_ctc", references=ddrs, **common)
    assert flags[flags.index("--task") + 1] == "kd_translation_lev" and flags[flags.index("--references") + 1] == 3
    assert flags[flags.index("--criterion") + 1] == "multi_reference_nat_loss"
    assert flags[flags.index("--reference-selection") + 1] == "ddrs"
    assert (flags[flags.index("--ddrs-max-update") + 1], flags[flags.index("--ddrs-save-interval-updates") + 1]) == \
        (2000, 33)
    single = fairseq_jobs.train_args(tmp_path, tmp_path, nat_family="glat_ctc", **common)
    assert "--references" not in single and single[single.index("--criterion") + 1] == "nat_loss"
    with pytest.raises(ValueError, match="nat students take one reference a sentence"):
        fairseq_jobs.train_args(tmp_path, tmp_path, nat_family="nat", references=ddrs, **common)
    with pytest.raises(ValueError, match="dat students take --reference-selection per-token-min or per-token-mean, "
                                         "not ddrs"):
        fairseq_jobs.train_args(tmp_path, tmp_path, nat_family="dat", references=ddrs, **common)
    selective = fairseq_jobs.train_args(tmp_path, tmp_path, nat_family="glat_ctc", **common,
                                        selective_kd={"kd_threshold": 0.4, "kd_threshold_updates": 2000})
    assert selective[selective.index("--task") + 1] == "selective_kd_translation_lev"
    assert selective[selective.index("--kd-threshold") + 1] == 0.4
    assert selective[selective.index("--kd-threshold-updates") + 1] == 2000


def test_a_judge_mix_is_judged_by_a_student_of_the_study(tmp_path):
    text = MINIMAL + ('[distill]\nmethods = []\n[students]\nfamilies = ["nat"]\n[[mixes]]\nname = "j-20"\n'
                      'of = "a.beam"\njudge = "student.nat.real"\ndistilled_share = 0.2\n')
    cfg = study_config.load(_write(tmp_path, text))
    steps = {s.name: s for s in build_plan(cfg, tmp_path)}
    assert steps["mix.j-20"].deps == ["prepare", "distil.a.beam", "student.nat.real"]
    assert steps["mix.j-20"].settings["rule"] == {"judge": "student.nat.real", "distilled_share": 0.2}
    assert "student.nat.j-20" in steps
    for judge in ("student.glat.real", "student.nat.j-20", "teacher.a"):
        with pytest.raises(ConfigError, match=re.escape(f"judge = '{judge}' is not a student of this study")):
            study_config.load(_write(tmp_path, text.replace('"student.nat.real"', f'"{judge}"')))


SELECTIVE = ('[distill]\nmethods = []\n[students]\nfamilies = ["nat", "glat_ctc"]\n[[mixes]]\nname = "skd"\n'
             'of = "a.beam"\nevaluator = "student.glat_ctc.a.beam"\nkd_threshold_updates = 2000\n')


def test_a_selective_kd_set_is_made_with_a_ctc_student_of_the_study_and_trained_on_with_the_task(tmp_path):
    """Its step scores the distilled set with the evaluator's checkpoint; its students take the threshold's
    settings given (the task's defaults for the rest); the analysis leaves it out (its texts are its set's)."""
    cfg = study_config.load(_write(tmp_path, MINIMAL + SELECTIVE))
    steps = {s.name: s for s in build_plan(cfg, tmp_path)}
    assert steps["mix.skd"].deps == ["prepare", "distil.a.beam", "student.glat_ctc.a.beam"]
    assert steps["mix.skd"].settings["selective_kd"] == {"evaluator": "student.glat_ctc.a.beam",
                                                         "kd_threshold_updates": 2000}
    assert steps["student.glat_ctc.skd"].deps == ["prepare", "mix.skd"] and "student.nat.skd" in steps
    assert steps["analysis"].deps == ["prepare", "distil.a.beam"]


@pytest.mark.parametrize("change, message", [
    (('"student.glat_ctc.a.beam"', '"student.nat.a.beam"'),
     "[[mixes]] skd: evaluator = 'student.nat.a.beam': Selective KD's evaluator is a CTC student"),
    (('"student.glat_ctc.a.beam"', '"student.glat_ctc.skd"'), "evaluator = 'student.glat_ctc.skd' is not a student"),
    (("kd_threshold_updates = 2000", "distilled_share = 0.2"), "[[mixes]] skd: unknown key(s) distilled_share; a "
                                                               "Selective KD set takes evaluator and kd_threshold"),
    (("kd_threshold_updates = 2000", "kd_threshold_updates = 0"), "kd_threshold_updates = 0: the update at which"),
])
def test_a_selective_kd_set_is_checked(tmp_path, change, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        study_config.load(_write(tmp_path, MINIMAL + SELECTIVE.replace(*change)))


def test_each_kd_method_is_judged_against_the_plain_set_it_was_made_from(tmp_path):
    """The kd-methods profile's sets, by hand: the Selective KD set and the DDRS references set, each against the
    same family's student on their plain beam set (and two mixes added here). A method whose seed-1 output says
    every reference where plain KD's loses a third is better (p below 0.05, checked against sacrebleu's paired
    bootstrap run here), one that loses a third is worse, and one whose seeds disagree with its seed-1 gap
    shows no difference; a plain student's seed 2 trained before the method's is left out of the means."""
    from dataclasses import replace

    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from nat_kd.study.config import MixSpec
    from nat_kd.study.kd_methods import kd_methods_section, plain_sets

    profile = study_config.load("kd-methods")
    assert plain_sets(profile) == {"selective-kd": "converged.beam", "three-teachers": "converged.beam",
                                   "union": "converged.beam"}
    cfg = replace(profile, mixes=profile.mixes + tuple(MixSpec(name, "converged.beam", {"repeated": True})
                                                       for name in ("elsewhere", "not-yet")))
    references = [f"ein hund nummer {i} läuft über die wiese" for i in range(30)]
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "test.de").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    res = {"prepare": {"dir": str(tmp_path / "data")}}
    full = references
    lossy = [r if i % 3 else "nichts" for i, r in enumerate(references)]

    def student(name, bleu, hypotheses=None):
        res[name] = {"test_bleu": bleu}
        if hypotheses is not None:
            path = tmp_path / f"{name}.hyp"
            path.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
            res[name]["test_hypotheses"] = str(path)

    student("student.ctc.converged.beam", 20.0, lossy)
    student("student.ctc.converged.beam.seed2", 20.4)
    student("student.ctc.three-teachers", 22.0, full)   # better at seed 1, and in the means
    student("student.ctc.three-teachers.seed2", 21.6)
    student("student.ctc.union", 23.0, full)  # better at seed 1, worse in the means: no verdict
    student("student.ctc.union.seed2", 16.0)
    student("student.glat_ctc.converged.beam", 25.0, full)
    student("student.glat_ctc.converged.beam.seed2", 27.0)  # the methods' seed 2 not yet: not in their means
    student("student.glat_ctc.selective-kd", 21.0, lossy)  # worse; its seed 2 not trained yet
    student("student.glat_ctc.elsewhere", 24.0)  # no test output on this machine: no p, no verdict
    student("student.glat_ctc.not-yet.seed2", 30.0)  # seed 1 missing: no row
    text = "".join(kd_methods_section(cfg, res))
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| student")}
    assert set(rows) == {("ctc", "three-teachers"), ("ctc", "union"), ("glat_ctc", "selective-kd"),
                         ("glat_ctc", "elsewhere")}
    test = PairedTest([("plain", lossy), ("method", full)], {"BLEU": BLEU()}, [references], test_type="bs",
                      n_samples=1000)
    p = test()[1]["BLEU"][1].p_value
    assert p < 0.05
    p = f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"  # the study's p cells: two significant digits below 0.001
    assert rows[("ctc", "three-teachers")][2:] == ["converged.beam", "22.00, 21.60", "20.00, 20.40", "+1.60",
                                                   p, "better than plain KD"]
    assert rows[("ctc", "union")][5:] == ["-0.70", p, "no difference shown"]
    assert rows[("glat_ctc", "selective-kd")][3:] == ["21.00", "25.00, 27.00", "-4.00 (seed 1, which both have)", p,
                                                      "worse than plain KD"]
    assert rows[("glat_ctc", "elsewhere")][5:] == ["-1.00 (seed 1, which both have)", "-", "no difference shown"]
    assert kd_methods_section(study_config.load("capacity"), res) == []  # no method's set in that study


def test_the_capacity_figure_of_a_study_under_way_draws_the_teachers_trained_so_far(tmp_path):
    """Two of the ladder's four teachers trained and no student on their sets yet (only the real-data ones): the
    figure is drawn on the teachers' span (log axes have no student point to scale by); with one teacher
    trained, nothing is drawn."""
    from nat_kd.study.results import capacity_figure

    cfg = study_config.load("ladder")
    res = {"teacher.tiny": {"parameters": 516480, "test_bleu": 26.9},
           "teacher.small": {"parameters": 1950720, "test_bleu": 34.84},
           "student.nat.real": {"test_bleu": 15.27}}
    assert capacity_figure(cfg, res, tmp_path / "two.png") is True
    assert (tmp_path / "two.png").stat().st_size > 10_000
    del res["teacher.small"]
    assert capacity_figure(cfg, res, tmp_path / "one.png") is False and not (tmp_path / "one.png").exists()


def test_the_sets_page_names_a_store_in_a_git_checkout_by_its_path_there(tmp_path):
    """A store given by an absolute path (a study run from a snapshot of the code, say) is written in the page's
    commands as the clone's path to it; a store outside any checkout as it was given."""
    import subprocess

    from nat_kd.study.released_sets import path_in_checkout

    clone = tmp_path / "clone"
    store = clone / "docs" / "results" / "ladder"
    store.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    assert path_in_checkout(store, str(store)) == "docs/results/ladder"
    assert path_in_checkout(clone / "docs" / ".." / "docs" / "results" / "ladder", "x") == "docs/results/ladder"
    assert path_in_checkout(tmp_path / "elsewhere", "../elsewhere") == "../elsewhere"


def test_the_sets_page_reads_each_card_from_its_archive_and_leaves_out_a_set_whose_archive_is_not_there(tmp_path):
    import io
    import lzma
    import tarfile

    from nat_kd.engine.store import Store
    from nat_kd.study.released_sets import kept_sets

    store = Store(tmp_path / "store", tmp_path / "study")
    (store.root / "steps").mkdir(parents=True)
    for name, params in (("distil.big.beam", 2000), ("distil.small.beam", 1000), ("distil.gone.beam", 10)):
        (store.root / "steps" / f"{name}.json").write_text(json.dumps({
            "name": name, "kind": "distil", "settings": {"teacher": f"teacher.{name.split('.')[1]}"},
            "result": {"name": name.removeprefix("distil.")}, "kept": {"archive": f"kept/{name}.tar.xz"}}))
        (store.root / "steps" / f"teacher.{name.split('.')[1]}.json").write_text(json.dumps({
            "name": f"teacher.{name.split('.')[1]}", "kind": "train", "result": {"parameters": params}}))
    (store.root / "kept").mkdir()
    for name in ("distil.big.beam", "distil.small.beam"):  # distil.gone.beam's archive was never committed
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            card = json.dumps({"teacher": {"sha256": [f"sha-of-{name}"]}}).encode()
            info = tarfile.TarInfo("data/card.json")
            info.size = len(card)
            tar.addfile(info, io.BytesIO(card))
        store.archive_file(name).write_bytes(lzma.compress(buffer.getvalue()))
    sets = kept_sets(store)
    assert [s["step"] for s in sets] == ["distil.small.beam", "distil.big.beam"]  # by the teachers' size
    assert [s["card"]["teacher"]["sha256"] for s in sets] == [["sha-of-distil.small.beam"], ["sha-of-distil.big.beam"]]


def test_the_sets_page_orders_teachers_of_one_shape_as_the_profile_does_and_names_a_student_step_of_the_plan(tmp_path):
    """kd-methods' three teachers have one shape: their sets follow the profile (seeds 1, 2, 3), not their names
    ('converged-s2' sorts before 'converged'); the commands use a set the study trains students on, with a step
    that --list has; where it trains none on a kept set, the page gives fairseq-train alone."""
    import io
    import lzma
    import tarfile

    from nat_kd.engine.store import Store
    from nat_kd.study.released_sets import sets_page

    cfg = study_config.load("kd-methods")
    plan = {s.name for s in build_plan(cfg, tmp_path / "plan")}
    store = Store(tmp_path / "store", tmp_path / "study")
    (store.root / "steps").mkdir(parents=True)
    (store.root / "kept").mkdir()

    def keep(teacher):
        name = f"distil.{teacher}.beam"
        (store.root / "steps" / f"{name}.json").write_text(json.dumps({
            "name": name, "kind": "distil", "settings": {"teacher": f"teacher.{teacher}"},
            "result": {"name": f"{teacher}.beam", "sentences": 29000},
            "kept": {"archive": f"kept/{name}.tar.xz", "sha256": "0" * 64}}))
        (store.root / "steps" / f"teacher.{teacher}.json").write_text(json.dumps({
            "name": f"teacher.{teacher}", "kind": "train", "result": {"parameters": 7579648}}))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w"):
            pass
        store.archive_file(name).write_bytes(lzma.compress(buffer.getvalue()))

    def page():
        text = sets_page(cfg, store, "docs/results/kd_methods", "kd-methods")
        return [line.split("`")[1] for line in text.splitlines() if line.startswith("| `distil.")], text

    for teacher in ("converged-s3", "converged-s2"):
        keep(teacher)
    order, text = page()
    assert order == ["distil.converged-s2.beam", "distil.converged-s3.beam"]
    assert "--only distil.converged-s2.beam\n" in text and "--only student." not in text
    assert "Train a student on it, here the study's glat_ctc student" in text
    keep("converged")
    order, text = page()
    assert order == ["distil.converged.beam", "distil.converged-s2.beam", "distil.converged-s3.beam"]
    steps = re.findall(r"--only ([\w.-]+)", text)
    assert steps == ["distil.converged.beam", "student.glat_ctc.converged.beam"] and set(steps) <= plan
    assert "STUDY/work/distil.converged.beam/data/bin" in text

    # Selective KD's accuracies, kept beside the sets: listed with their evaluator, restored by a step of the plan
    (store.root / "steps" / "mix.selective-kd.json").write_text(json.dumps({
        "name": "mix.selective-kd", "kind": "mix", "result": {"name": "selective-kd", "sentences": 29000,
                                                               "mean_accuracy": 0.6767},
        "settings": {"of": "distil.converged.beam", "selective_kd": {
            "evaluator": "student.glat_ctc.converged.beam", "kd_threshold": 0.4, "kd_threshold_offset": 0.6,
            "kd_threshold_updates": 2000}},
        "kept": {"archive": "kept/mix.selective-kd.tar.xz", "sha256": "0" * 64}}))
    (store.root / "steps" / "student.glat_ctc.converged.beam.json").write_text(json.dumps({
        "name": "student.glat_ctc.converged.beam", "kind": "train", "result": {"test_bleu": 22.81}}))
    assert "Selective KD" not in page()[1]  # its archive is not there
    store.archive_file("mix.selective-kd").write_bytes(b"x" * 45328)
    text = page()[1]
    assert ("| `mix.selective-kd` | `distil.converged.beam` | `student.glat_ctc.converged.beam` | 22.81 | 29,000 | "
            "0.677 | kd_threshold 0.4, kd_threshold_offset 0.6, kd_threshold_updates 2000 | "
            "[0.04 MB](kept/mix.selective-kd.tar.xz) |") in text
    steps = re.findall(r"--only ([\w.-]+)", text)
    assert steps[2:] == ["mix.selective-kd", "student.glat_ctc.selective-kd"] and set(steps) <= plan
    assert text.index("## Selective KD") < text.index("## Each set")
