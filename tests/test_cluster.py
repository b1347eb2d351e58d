"""The study's steps and the generator's shards as submitit jobs: submitit's local executor (a process a job)
and its debug executor (in the driver) run the code paths of ``--launcher slurm``; no Slurm is needed."""
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import cloudpickle
import pytest

from conftest import process_running
from slurm_stand_in import SlurmStandIn
from nat_kd.launch.jobs import Submitted
from nat_kd.launch.sbatch import job_name
from nat_kd.launch.settings import (ClusterConfig, LauncherSettings, LaunchError, Resources, cluster_config,
                                    read_cluster_file)
from nat_kd.engine.cluster import JobLauncher
from nat_kd.engine.runner import Runner, Step, StepError

# the jobs unpickle this module's step functions in processes that cannot import it
cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parent.parent
FAST = ClusterConfig(LauncherSettings(poll_seconds=0.2))


def _write(ctx, deps, value, fail=False):
    """A step writing ``value`` and its dependencies' texts to work/out.txt, counting its runs in
    ../calls.txt (the jobs run in other processes)."""
    with open(ctx.work.parent.parent / "calls.txt", "a") as calls:
        calls.write(ctx.step.name + "\n")
    if fail:
        ctx.log.write_text("loading the data\nsomething is wrong on line 7 of the input\n")
        raise RuntimeError("boom")
    text = value + "".join(ctx.results[d]["text"] for d in deps)
    (ctx.work / "out.txt").write_text(text)
    return {"text": text, "outputs": [str(ctx.work / "out.txt")]}


def _wait_for_file(ctx, deps, value, flag):
    """A step that runs until ``flag`` exists (a long job), then writes like _write; counts its starts in
    ../starts.txt."""
    with open(ctx.work.parent.parent / "starts.txt", "a") as starts:
        starts.write(ctx.step.name + "\n")
    deadline = time.time() + 300  # a job left behind by a failed test ends by itself
    while not Path(flag).exists():
        if time.time() > deadline:
            raise TimeoutError(f"{flag} never came")
        time.sleep(0.1)
    return _write(ctx, deps, value)


def _plan(fail=False):
    from functools import partial

    return [Step("a", "test", {"v": "1"}, partial(_write, deps=[], value="1")),
            Step("b", "test", {"v": "2"}, partial(_write, deps=["a"], value="2", fail=fail), ["a"]),
            Step("c", "test", {"v": "3"}, partial(_write, deps=[], value="3"))]


def _calls(root):
    path = Path(root) / "calls.txt"
    return sorted(path.read_text().split()) if path.is_file() else []


def _outputs(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((Path(root) / "work").rglob("out.txt"))}


@pytest.mark.parametrize("launcher", ["submitit-local", "debug"])
def test_steps_as_jobs_give_the_local_runners_records_and_outputs(tmp_path, launcher):
    local = Runner(tmp_path / "local", jobs=2).run(_plan())
    out = tmp_path / launcher
    records = Runner(out, launcher=JobLauncher(out, launcher, FAST)).run(_plan())
    assert _outputs(out) == _outputs(tmp_path / "local") and _calls(out) == ["a", "b", "c"]
    for name, record in records.items():
        assert record["result"]["text"] == local[name]["result"]["text"]
        assert record == json.loads((out / "steps" / f"{name}.json").read_text())  # written by the job itself
        assert record["launcher"]["launcher"] == launcher and record["launcher"]["job_id"]
    if launcher == "submitit-local":  # a job of its own: its id is its process's
        assert len({r["launcher"]["job_id"] for r in records.values()}) == 3
    # the records are the one source of truth: the local runner finds every step done, and so do the jobs
    assert [line.split()[0] for line in Runner(out).status(_plan())] == ["done"] * 3
    runner = Runner(out, launcher=JobLauncher(out, launcher, FAST))
    runner.run(_plan())
    assert runner.ran == [] and _calls(out) == ["a", "b", "c"]


def test_a_failing_job_is_reported_with_its_id_and_log_and_the_rest_resumes(tmp_path):
    launcher = JobLauncher(tmp_path, "submitit-local", FAST)
    with pytest.raises(StepError) as err:
        Runner(tmp_path, launcher=launcher).run(_plan(fail=True))
    message = str(err.value)
    job_id = next((tmp_path / "jobs" / "b").glob("*_submitted.pkl")).name.split("_")[0]
    first, log = message.splitlines()  # one line, and the log's path
    assert first.startswith(f"step b failed in submitit-local job {job_id}: ")
    assert first.endswith("StepError: step b failed: RuntimeError: boom")
    assert log == f"  log: {tmp_path / 'logs' / 'b.log'}"
    assert not (tmp_path / "steps" / "b.json").exists() and _calls(tmp_path) == ["a", "b", "c"]
    Runner(tmp_path, launcher=JobLauncher(tmp_path, "submitit-local", FAST)).run(_plan())
    assert _calls(tmp_path) == ["a", "b", "b", "c"]  # only the failed step again


DRIVER = """
import logging
import sys
from functools import partial
from pathlib import Path
sys.path.insert(0, {tests!r})
import test_cluster as t
from nat_kd.launch.signals import sigterm_as_interrupt
from nat_kd.engine.cluster import JobLauncher
from nat_kd.engine.runner import Runner, Step
root = Path({root!r})
logging.basicConfig(level=logging.INFO)
plan = [Step("slow", "test", {{}}, partial(t._wait_for_file, deps=[], value="s", flag=str(root / "go")))]
with sigterm_as_interrupt():
    Runner(root, launcher=JobLauncher(root, "submitit-local", t.FAST, detach={detach})).run(plan)
"""


def _driver_killed_while_its_job_runs(root, detach):
    """Start a driver on the slow step in its own process, SIGTERM it once the job is submitted. The driver
    ignores SIGINT, as one started by ``nohup ... &`` in a script does, and its job inherits that: submitit-local
    cancels a job with SIGINT."""
    root.mkdir()
    log = root / "driver.log"  # not a pipe: a detached job inherits the driver's streams and holds a pipe open
    with open(log, "w") as streams:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(tests=str(ROOT / "tests"), root=str(root),
                                                                       detach=detach)],
                                  cwd=ROOT, stdout=streams, stderr=subprocess.STDOUT,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    marker = root / "jobs" / "slow" / "submitted.json"
    deadline = time.time() + 120
    while not marker.exists() or not (root / "starts.txt").exists():  # submitted, and the job is running
        assert driver.poll() is None and time.time() < deadline, log.read_text()
        time.sleep(0.1)
    job_pid = int(json.loads(marker.read_text())["job_id"])
    driver.send_signal(signal.SIGTERM)
    driver.wait(timeout=60)
    return job_pid, log.read_text()


def _slow_plan(root):
    from functools import partial

    return [Step("slow", "test", {}, partial(_wait_for_file, deps=[], value="s", flag=str(root / "go")))]


def test_a_stopped_driver_cancels_its_jobs_and_a_rerun_does_the_step_again(tmp_path):
    root = tmp_path / "study"
    job_pid, output = _driver_killed_while_its_job_runs(root, detach=False)
    assert "cancelling submitit-local job" in output
    deadline = time.time() + 30
    while process_running(job_pid):
        assert time.time() < deadline, "the job was not cancelled"
        time.sleep(0.1)
    (root / "go").touch()
    Runner(root, launcher=JobLauncher(root, "submitit-local", FAST)).run(_slow_plan(root))
    assert (root / "starts.txt").read_text() == "slow\nslow\n" and _calls(root) == ["slow"]


def test_a_detached_job_runs_on_and_the_next_run_collects_it(tmp_path):
    root = tmp_path / "study"
    job_pid, output = _driver_killed_while_its_job_runs(root, detach=True)
    assert "left running (--detach)" in output and process_running(job_pid)
    from nat_kd.engine.cluster import job_notes

    assert job_notes(root, _slow_plan(root)) == {"slow": f"  (submitit-local job {job_pid} RUNNING)"}  # --list
    # the step with other settings meanwhile: no second job in the same folder, the running one named
    changed = [Step("slow", "test", {"value": 2}, _slow_plan(root)[0].run)]
    with pytest.raises(StepError, match=f"step slow: submitit-local job {job_pid}, submitted by an earlier run "
                                        "with other settings, is still queued or running"):
        Runner(root, launcher=JobLauncher(root, "submitit-local", FAST)).run(changed)
    assert process_running(job_pid) and (root / "starts.txt").read_text() == "slow\n"
    (root / "go").touch()  # the job finishes after its driver has gone
    runner = Runner(root, launcher=JobLauncher(root, "submitit-local", FAST))
    records = runner.run(_slow_plan(root))
    assert records["slow"]["result"]["text"] == "s" and records["slow"]["launcher"]["job_id"] == str(job_pid)
    assert (root / "starts.txt").read_text() == "slow\n"  # waited for or found done, never submitted again


def test_a_refused_submission_fails_its_step_while_the_running_jobs_finish_and_are_collected(tmp_path, monkeypatch):
    """sbatch refusing one job (a time limit above the partition's) fails that step with sbatch's message; the
    job already running is not cancelled: it ends, its record is collected, and then the run fails."""
    import threading
    from functools import partial

    import submitit

    root = tmp_path / "study"
    refused = root / "refused"
    plan = [Step("slow", "test", {}, partial(_wait_for_file, deps=[], value="s", flag=str(root / "go"))),
            Step("bad", "test", {}, partial(_write, deps=[], value="b"))]

    def submit(executor, function, *args, **kwargs):
        if args[1].name != "bad":
            return real(executor, function, *args, **kwargs)
        from submitit.core.utils import FailedJobError

        while not (root / "starts.txt").exists():  # refused while the other job runs
            time.sleep(0.1)
        refused.touch()
        raise FailedJobError("sbatch: error: Batch job submission failed: Requested time limit is invalid "
                             "(missing or exceeds some limit)")

    real = submitit.AutoExecutor.submit
    monkeypatch.setattr(submitit.AutoExecutor, "submit", submit)
    failure = []

    def drive():
        try:
            Runner(root, launcher=JobLauncher(root, "submitit-local", FAST)).run(plan)
        except StepError as err:
            failure.append(str(err))

    driver = threading.Thread(target=drive)
    driver.start()
    deadline = time.time() + 120
    while not refused.exists():
        assert time.time() < deadline and driver.is_alive()
        time.sleep(0.1)
    time.sleep(1)  # the refusal has reached the runner: the job still runs
    slow_pid = int(json.loads((root / "jobs" / "slow" / "submitted.json").read_text())["job_id"])
    assert process_running(slow_pid), "the running job was cancelled"
    (root / "go").touch()
    driver.join(120)
    assert failure == ["step bad failed: the job could not be submitted: sbatch: error: Batch job submission failed: "
                       "Requested time limit is invalid (missing or exceeds some limit)"]
    assert json.loads((root / "steps" / "slow.json").read_text())["result"]["text"] == "s"  # collected
    assert Runner(root).states(plan) == {"slow": "done", "bad": "to run"}


# ------------------------------------------------------------------ settings and dry runs


def test_resources_come_from_the_kind_then_the_kind_table_then_the_step_table(tmp_path):
    from dataclasses import replace

    from nat_kd.engine.cluster import STEP_RESOURCES, step_resources

    cluster = cluster_config({"resources": {"train": {"gpus": 4, "hours": 100}, "teacher.big": {"mem_gb": 64}}})
    train = STEP_RESOURCES["train"]
    step = lambda name, kind: Step(name, kind, {}, None)  # noqa: E731
    assert step_resources(cluster, step("teacher.big", "train")) == replace(train, gpus=4, mem_gb=64, hours=100)
    assert step_resources(cluster, step("teacher.base", "train")) == replace(train, gpus=4, hours=100)
    assert step_resources(cluster, step("analysis", "analysis")) == STEP_RESOURCES["analysis"]


@pytest.mark.parametrize("text, message", [
    ("[launcher]\npartion = 'gpu'\n", "[launcher]: unknown key(s) partion"),
    ("[launcher]\nmax_jobs = 'many'\n", "[launcher].max_jobs = 'many': expected an integer"),
    ("[resources.train]\ngpu = 2\n", "[resources.train]: unknown key(s) gpu"),
    ("[resources]\ntrain = 2\n", "expected a table [resources.train]"),
    ("[study]\njobs = 2\n", "holds [launcher] and [resources.*] only"),
])
def test_cluster_file_errors_name_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(LaunchError) as err:
        read_cluster_file(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_paper_dry_run_prints_every_job_with_its_sbatch_options(tmp_path, capsys):
    from nat_kd.study import config as study_config
    from nat_kd.study.__main__ import main
    from nat_kd.study.plan import build_plan

    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[launcher]\npartition = "gpu"\naccount = "nmt"\nsetup = ["source .venv/bin/activate"]\n'
                       '[resources.train]\nhours = 100\n[resources."teacher.big"]\ngpus = 4\n')
    assert main(["paper", "--launcher", "slurm", "--cluster", str(cluster), "--dry-run",
                 "--out", str(tmp_path / "paper")]) == 0
    out = capsys.readouterr().out
    steps = build_plan(study_config.load("paper"), tmp_path)
    heads = [line for line in out.splitlines() if not line.startswith(" ")]
    assert [h.split()[0] for h in heads] == [s.name for s in steps]  # every step, in plan order
    big = out.split("teacher.big  ", 1)[1].split("\n", 1)[0]
    assert big == "[train: 4 GPU, 8 CPU, 32 GB, 100 h, saved every 2000 updates] after prepare"
    block = out.split("teacher.big  ", 1)[1].split("\n" + "distil.big.beam", 1)[0]
    for option in ["--gpus-per-node=4", "--time=6000", "--partition=gpu", "--account=nmt", "--mem=32GB",
                   "--cpus-per-task=8", f"--job-name={job_name('teacher.big', tmp_path / 'paper')}"]:
        assert f"#SBATCH {option}" in block, option
    assert "[prepare: 0 GPU, 4 CPU, 16 GB, 4 h]" in out and "#SBATCH --gpus-per-node" not in out.split("teacher.")[0]
    assert not (tmp_path / "paper").exists()  # nothing ran, nothing made: a mistyped --out leaves no folder behind
    cluster.write_text('[resources."teacher.huge"]\ngpus = 4\n')
    assert main(["paper", "--launcher", "slurm", "--cluster", str(cluster), "--dry-run",
                 "--out", str(tmp_path / "paper")]) == 2
    assert '[resources."teacher.huge"] is neither a job kind' in capsys.readouterr().err


@pytest.mark.parametrize("command", ["study", "choose", "generate_distilled"])
@pytest.mark.parametrize("flags, named", [(["--detach"], "--detach"), (["--cluster", "c.toml"], "--cluster"),
                                          (["--detach", "--cluster", "c.toml"], "--detach and --cluster")])
def test_job_flags_without_a_launcher_are_refused_not_ignored(command, flags, named, tmp_path, capsys):
    """--detach and --cluster mean something only to jobs; with the local launcher they used to be ignored."""
    from nat_kd.choose import main as choose
    from nat_kd.distill.__main__ import main as generate
    from nat_kd.study.__main__ import main as study

    out = tmp_path / "out"
    main, argv = {"study": (study, ["micro", "--out", str(out)]),
                  "choose": (choose, ["--corpus", "c", "--candidates", "s", "--arch", "kd_nat_tiny", "--updates", "9",
                             "--out", str(out)]),
                  "generate_distilled": (generate, ["--teacher-path", "m.pt", "--prepared", "c", "--out", str(out)])}[command]
    assert main(argv + flags) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {named} without --launcher") and "--launcher slurm" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_a_profile_may_hold_the_launcher_tables(tmp_path):
    from nat_kd.study import config as study_config

    profile = tmp_path / "study.toml"
    profile.write_text((ROOT / "nat_kd/study/profiles/micro.toml").read_text()
                       + '\n[launcher]\npartition = "dev"\nmax_jobs = 3\n[resources.distil]\ngpus = 0\n')
    cfg = study_config.load(profile)
    assert (cfg.cluster.launcher.partition, cfg.cluster.launcher.max_jobs) == ("dev", 3)
    assert cfg.cluster.resources == {"distil": {"gpus": 0}}
    over = cfg.cluster.over(cluster_config({"launcher": {"account": "a"}, "resources": {"distil": {"hours": 2}}}))
    assert (over.launcher.partition, over.launcher.account, over.launcher.max_jobs) == ("dev", "a", 3)
    assert over.resources == {"distil": {"gpus": 0, "hours": 2}}
    profile.write_text(profile.read_text() + "[launcher.extra]\n")
    with pytest.raises(LaunchError, match=rf"{profile}: \[launcher\]: unknown key\(s\) extra"):
        study_config.load(profile)


def test_multi_gpu_training_asks_fairseq_for_its_own_data_parallel_training(tmp_path, monkeypatch):
    from nat_kd.engine import fairseq_jobs
    from fairseq_plugins.models.sizes import ModelSize
    from nat_kd.engine.training import Training

    commands = []
    monkeypatch.setattr(fairseq_jobs, "run_logged", lambda module, args, *a, **k: commands.append(list(map(str, args))))
    (tmp_path / "checkpoint_best.pt").touch()
    for gpus in (0, 1, 4):
        fairseq_jobs.train(tmp_path, tmp_path, arch="a", shape=ModelSize(8, 8, 1, 1), training=Training(updates=1),
                           log=tmp_path / "log", threads=1, gpus=gpus)
    assert ["--distributed-world-size" in c for c in commands] == [False, False, True]
    assert commands[2][commands[2].index("--distributed-world-size") + 1] == "4"


def test_the_glancing_schedule_reaches_only_the_glancing_students(tmp_path, monkeypatch):
    from nat_kd.engine import fairseq_jobs
    from fairseq_plugins.models.sizes import ModelSize
    from nat_kd.engine.training import Training

    commands = []
    monkeypatch.setattr(fairseq_jobs, "run_logged", lambda module, args, *a, **k: commands.append(list(map(str, args))))
    (tmp_path / "checkpoint_best.pt").touch()
    for family, anneal in [("glat", 1333), ("dat", 1333), ("glat_ctc", 0), ("nat", 1333), ("ctc", 1333)]:
        fairseq_jobs.train(tmp_path, tmp_path, arch="a", shape=ModelSize(8, 8, 1, 1), nat_family=family,
                           training=Training(updates=1, glance_anneal_updates=anneal), log=tmp_path / "log", threads=1)
    flagged = [c[c.index("--glance-anneal-updates") + 1] if "--glance-anneal-updates" in c else None
               for c in commands]
    assert flagged == ["1333", "1333", None, None, None]


def test_label_smoothing_reaches_only_the_students_whose_loss_takes_it(tmp_path, monkeypatch):
    from nat_kd.engine import fairseq_jobs
    from fairseq_plugins.models.sizes import ModelSize
    from nat_kd.engine.training import Training

    commands = []
    monkeypatch.setattr(fairseq_jobs, "run_logged", lambda module, args, *a, **k: commands.append(list(map(str, args))))
    (tmp_path / "checkpoint_best.pt").touch()
    for family in ("nat", "glat", "glat_ctc", "dat", None):
        fairseq_jobs.train(tmp_path, tmp_path, arch="a", shape=ModelSize(8, 8, 1, 1), nat_family=family,
                           training=Training(updates=1, label_smoothing=0.1), log=tmp_path / "log", threads=1)
    assert [c[c.index("--label-smoothing") + 1] for c in commands] == ["0.1", "0.1", "0.0", "0.0", "0.1"]


# ------------------------------------------------------------------ real steps: the micro profile's first ones

MICRO_STEPS = ("prepare", "teacher.t1", "distil.t1.beam")
# one CPU and no GPU a job, as the local runner's one torch thread a step: the same arithmetic, the same bytes
ONE_CPU = ClusterConfig(LauncherSettings(poll_seconds=0.2),
                        {kind: {"cpus": 1, "gpus": 0} for kind in ("prepare", "train", "distil")})


def _micro_plan(out, data_dir):
    from nat_kd.study import config as study_config
    from nat_kd.study.plan import build_plan

    return [s for s in build_plan(study_config.load("micro"), out / "results", data_dir) if s.name in MICRO_STEPS]


def _products(out):
    """The steps' data products, byte for byte: the teacher's test translations and the distilled set."""
    work = out / "work"
    files = [work / "teacher.t1" / "test.hyp", *sorted((work / "distil.t1.beam" / "data").rglob("*"))]
    return {f.relative_to(work).as_posix(): f.read_bytes() for f in files
            if f.is_file() and f.name not in ("meta.json", "card.json", "CARD.md")}  # these hold timings


@pytest.fixture(scope="module")
def micro_local(tmp_path_factory):
    """prepare, the teacher t1 and its beam set of the micro profile, run by the local runner."""
    from conftest import small_multi30k

    base = tmp_path_factory.mktemp("micro")
    corpus = small_multi30k(base / "multi30k")
    out = base / "local"
    records = Runner(out, jobs=1).run(_micro_plan(out, corpus))
    return corpus, out, records


@pytest.mark.slow
def test_micro_steps_as_jobs_give_the_local_runners_bytes(micro_local, tmp_path):
    import shutil

    corpus, local, _ = micro_local
    out = tmp_path / "jobs"
    # the local run's prepare record, copied: the jobs take the study on from there, as they would a study
    # that was started without them (the records are the one source of truth)
    (out / "steps").mkdir(parents=True)
    shutil.copyfile(local / "steps" / "prepare.json", out / "steps" / "prepare.json")
    runner = Runner(out, launcher=JobLauncher(out, "submitit-local", ONE_CPU))
    records = runner.run(_micro_plan(out, corpus))
    assert runner.skipped == ["prepare"] and sorted(runner.ran) == ["distil.t1.beam", "teacher.t1"]
    assert set(records) == set(MICRO_STEPS) and all(records[n]["launcher"]["job_id"] for n in runner.ran)
    products = _products(out)
    assert len(products) > 10 and products == _products(local)
    assert "fairseq_cli.train" in (out / "logs" / "teacher.t1.log").read_text()  # the job's log, where it was


def _generator_args(micro_local, out, *extra) -> list[str]:
    """The generator's command line as the study's distil step runs it, with ``extra`` options."""
    _, local, records = micro_local
    step = records["distil.t1.beam"]["settings"]
    flags = [x for key, value in step["decoding"].items() for x in (f"--{key.replace('_', '-')}", str(value))]
    return ["--teacher-path", records["teacher.t1"]["result"]["checkpoint"],
            "--prepared", records["prepare"]["result"]["dir"], "--split", "train", "--strategy", "beam", *flags,
            "--max-tokens", str(step["max_tokens"]), "--workers", "1", "--threads", "1", "--no-progress-bar",
            "--out", str(out), *extra]


def _generate(micro_local, out, *extra):
    from nat_kd.generate_distilled import main

    return main(_generator_args(micro_local, out, *extra))


def _set_bytes(folder):
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(Path(folder).rglob("*"))
            if f.is_file() and f.name not in ("meta.json", "card.json", "CARD.md")}


@pytest.mark.slow
def test_shards_as_a_job_array_give_the_unsharded_set_and_resume_from_saved_chunks(micro_local, tmp_path, capsys):
    _, local, _ = micro_local
    reference = _set_bytes(local / "work" / "distil.t1.beam" / "data")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text("[launcher]\npoll_seconds = 0.2\n[resources.distil]\ngpus = 0\ncpus = 1\n")
    out = tmp_path / "sharded"
    shards = ["--num-shards", "2", "--chunk-sentences", "30", "--cluster", str(cluster)]
    assert _generate(micro_local, out, "--num-shards", "2", "--launcher", "slurm", "--dry-run") == 0
    printed = capsys.readouterr().out
    assert (f"{job_name('distil.sharded', out)}: an array of 2 shard job(s) [1 GPU, 8 CPU, 32 GB, 24 h each]"
            in printed)
    assert "#SBATCH --array=0-1%2" in printed and "#SBATCH --gpus-per-node=1" in printed
    assert not out.exists() and not (tmp_path / "sharded.jobs").exists()  # a dry run submits and writes nothing
    assert _generate(micro_local, out, *shards, "--launcher", "submitit-local") == 0
    assert _set_bytes(out) == reference
    assert len(list((tmp_path / "sharded.jobs").glob("*_submitted.pkl"))) == 2  # one job a shard
    assert not (tmp_path / "sharded.partial").exists()  # merged by the last shard, progress removed
    # a rerun finds the set complete (same teacher, corpus and settings) and submits nothing
    assert _generate(micro_local, out, *shards, "--launcher", "submitit-local") == 0
    assert len(list((tmp_path / "sharded.jobs").glob("*_submitted.pkl"))) == 2 and _set_bytes(out) == reference
    # shard 0 decoded here beforehand (a job that finished before its driver was stopped): only 1 goes out
    out = tmp_path / "resumed"
    _generate(micro_local, out, "--num-shards", "2", "--chunk-sentences", "30", "--shard-id", "0")
    assert (tmp_path / "resumed.partial").is_dir() and not out.exists()
    assert _generate(micro_local, out, *shards, "--launcher", "submitit-local") == 0
    assert _set_bytes(out) == reference
    assert len(list((tmp_path / "resumed.jobs").glob("*_submitted.pkl"))) == 1


@pytest.mark.parametrize("launcher", [[], ["--launcher", "submitit-local"]])
def test_ctrl_c_stops_generate_distilled_with_a_line_not_a_traceback(launcher, micro_local, tmp_path, monkeypatch,
                                                                     capsys):
    """Decoding here or as jobs, the set resumes from its saved chunks: the same line as study's and choose's."""
    from nat_kd.distill import cluster, pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster.ShardLauncher, "run", interrupted)
    monkeypatch.setattr(pipeline, "distill", interrupted)
    assert _generate(micro_local, tmp_path / "out", *launcher) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "stopped; rerun the same command to go on"
    assert ("jobs: no job was running" in err) == bool(launcher)  # which jobs were cancelled: none had started


def test_bad_inputs_are_refused_before_any_job_is_submitted(micro_local, tmp_path, capsys):
    """What every shard would refuse at its start is refused by the driver, once, in one line: no job is
    submitted, none is resubmitted."""
    cluster = tmp_path / "cluster.toml"
    cluster.write_text("[launcher]\npoll_seconds = 0.2\nmax_retries = 1\n[resources.distil]\ngpus = 0\ncpus = 1\n")
    (tmp_path / "file").touch()
    for out, extra, message in [
            (tmp_path / "bad", ["--max-tokens", "4"], "--max-tokens 4 is smaller than the longest sentence"),
            (tmp_path / "bad", ["--split", "nosuch"], "nosuch"),
            (tmp_path / "file" / "bad", [], "file is a file, not a folder, so"),
            (tmp_path / "bad", ["--fp16"], "--fp16 runs the teacher in half precision on a GPU: set [resources.distil] "
                                           "gpus = 1")]:
        assert _generate(micro_local, out, "--num-shards", "2", "--launcher", "submitit-local", "--cluster",
                         str(cluster), *extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
        assert not out.with_name(out.name + ".jobs").exists()  # nothing submitted


def test_only_a_cause_outside_the_job_is_retried(micro_local, tmp_path, monkeypatch):
    """A shard's own error (its settings, its teacher) would fail again: reported, never resubmitted (a shard
    preempted is: test_a_preempted_shard_is_resubmitted_and_the_array_is_collected)."""
    from nat_kd.distill.__main__ import build_parser, config_from_args
    from nat_kd.distill.cluster import ShardJob, ShardLauncher
    from nat_kd.errors import SettingsError

    _, _, records = micro_local
    calls = []

    def fails(self, cfg, shard_id, num_shards):
        calls.append(shard_id)
        raise SettingsError("the teacher's dictionary does not match")
    monkeypatch.setattr(ShardJob, "__call__", fails)
    args = build_parser([]).parse_args(["--teacher-path", records["teacher.t1"]["result"]["checkpoint"],
                                        "--prepared", records["prepare"]["result"]["dir"], "--out",
                                        str(tmp_path / "out"), "--workers", "1", "--threads", "1"])
    launcher = ShardLauncher(config_from_args(args), "debug", ClusterConfig(LauncherSettings(poll_seconds=0.1,
                                                                                             max_retries=2)))
    with pytest.raises(LaunchError, match="shard 0 of .* failed in debug job"):
        launcher.run()
    assert calls == [0]  # the old code resubmitted it max_retries times


def test_jobs_near_their_time_limit_are_requeued_with_the_same_call():
    """submitit requeues a Checkpointable job with what its checkpoint() returns: the same step or shard,
    which then resumes from its work folder (fairseq's last checkpoint) or its saved chunks."""
    from nat_kd.distill.cluster import ShardJob
    from nat_kd.engine.cluster import StepJob

    for job, args in [(StepJob(), ("root", "step", "fp", {}, Resources(), "slurm", 4)), (ShardJob(), ("cfg", 3, 8))]:
        again = job.checkpoint(*args)
        assert again.function is job and again.args == args and again.kwargs == {}


# ------------------------------------------------------------------ GPU types, per-kind options, detached plans


def _paper_dry_run(tmp_path, capsys, cluster_text, *extra):
    from nat_kd.study.__main__ import main

    cluster = tmp_path / "cluster.toml"
    cluster.write_text(cluster_text)
    code = main(["paper", "--launcher", "slurm", "--cluster", str(cluster), "--dry-run", "--out",
                 str(tmp_path / "paper"), *extra])
    out, err = capsys.readouterr()
    return code, out, err, cluster


def _job_block(out, step):
    """The indented lines a dry run prints under one step's heading."""
    lines = ("\n" + out).split(f"\n{step}  ", 1)[1].split("\n")[1:]
    return "\n".join(line for line in lines[:next(i for i, line in enumerate(lines) if not line.startswith(" "))])


def test_gpu_type_and_per_kind_options_reach_only_their_jobs_with_the_setup_lines(tmp_path, capsys):
    code, out, err, _ = _paper_dry_run(tmp_path, capsys, '[launcher]\ngpu_type = "a100"\nsetup = ["module load cuda"]\n'
                                       '[resources.train]\nfp16 = true\nsbatch = {gpu-bind = "closest"}\n')
    assert code == 0, err
    big, distil, prepare = (_job_block(out, s) for s in ("teacher.big", "distil.big.beam", "prepare"))
    assert "#SBATCH --gpus-per-node=a100:1" in big and "#SBATCH --gpu-bind=closest" in big
    assert "fp16" in out.split("\nteacher.big  ", 1)[1].split("\n", 1)[0]
    assert "#SBATCH --gpus-per-node=a100:1" in distil and "gpu-bind" not in distil  # the train kind's option only
    assert "gpus-per-node" not in prepare and "gres" not in out  # CPU jobs ask for no GPU
    for block in (big, distil, prepare):
        assert block.endswith("    # setup\n    module load cuda"), block  # what each job runs first


@pytest.mark.parametrize("text, message", [
    ('[launcher]\nsbatch = {gres = "gpu:a100:1"}\n', "[launcher].sbatch: gres = 'gpu:a100:1' would mix with the "
     "--gpus-per-node the jobs get from gpus: set [resources.KIND] gpus = N and gpu_type"),
    ('[resources.train]\nsbatch = {gpus-per-node = 2}\n', "[resources.train].sbatch: gpus_per_node = 2 would mix"),
    ('[launcher]\nsbatch = {mem_per_gpu = "40G"}\n', "[launcher].sbatch: mem_per_gpu would reach the CPU jobs too"),
    ('[resources.prepare]\nsbatch = {gpu_bind = "closest"}\n', "step prepare ([resources.prepare]): sbatch gpu_bind "
     "on a job without a GPU (gpus = 0): set gpus = 1, or drop it"),
    ('[resources.distil]\ngpus = 0\nfp16 = true\n', "step distil.tiny.beam ([resources.distil]): fp16 on a job "
     "without a GPU"),
    ('[resources.analysis]\nfp16 = true\n', "[resources.analysis].fp16 = True: only distil and train jobs read fp16; "
     "drop it"),
])
def test_gpu_options_that_would_mix_or_reach_a_cpu_job_are_refused_in_one_line(tmp_path, capsys, text, message):
    code, out, err, cluster = _paper_dry_run(tmp_path, capsys, text)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert str(cluster) in err and message in err, err


def test_the_job_array_runs_at_most_max_jobs_shards_and_the_merge_job_is_a_short_cpu_job(tmp_path):
    from nat_kd.distill.cluster import ShardLauncher
    from nat_kd.distill.config import DistillConfig

    cfg = DistillConfig(teachers=[str(tmp_path / "t.pt")], out_dir=str(tmp_path / "out"), num_shards=16)
    cluster = cluster_config({"launcher": {"max_jobs": 4, "gpu_type": "a100"}})
    lines = ShardLauncher(cfg, "slurm", cluster).dry_run()
    merge = lines.index(next(line for line in lines if line.startswith("nat_kd.merge.out")))
    assert "    #SBATCH --array=0-15%4" in lines[:merge] and "    #SBATCH --gpus-per-node=a100:1" in lines[:merge]
    assert "[0 GPU, 4 CPU, 32 GB, 2 h]" in lines[merge]
    assert not any("gpus-per-node" in line for line in lines[merge:]) and "    #SBATCH --time=120" in lines[merge:]


def test_training_saves_every_n_updates_in_fp16_and_counts_the_updates_a_requeue_repeats(tmp_path, monkeypatch):
    import torch

    from nat_kd.engine import fairseq_jobs
    from fairseq_plugins.models.sizes import ModelSize
    from nat_kd.engine.training import Training

    commands, reached = [], iter([2350, 4000])

    def fairseq_train(module, args, log, *a, **k):  # a run killed at update 2,350, then one that ends at 4,000
        commands.append(list(map(str, args)))
        updates = next(reached)
        with open(log, "a") as handle:
            handle.write(f"$ python -m fairseq_cli.train ...\nINFO | train_inner | epoch 001:  {updates} / 19000 "
                         f"loss=5.1, num_updates={updates}, lr=0.0005\n")
        if updates == 4000:  # a run that ends says so, as fairseq-train does
            torch.save({"optimizer_history": [{"num_updates": 4000}]}, save_dir / "checkpoint_last.pt")
            with open(log, "a") as handle:
                handle.write("INFO | fairseq_cli.train | done training in 812.3 seconds\n")
    monkeypatch.setattr(fairseq_jobs, "run_logged", fairseq_train)
    save_dir, log = tmp_path / "checkpoints", tmp_path / "log"
    save_dir.mkdir()
    (save_dir / "checkpoint_best.pt").touch()
    train = dict(arch="a", shape=ModelSize(8, 8, 1, 1), training=Training(updates=4000), log=log, threads=1)
    fairseq_jobs.train(tmp_path, save_dir, **train, gpus=1, fp16=True, save_updates=2000)
    flags = commands[0]
    assert flags[flags.index("--save-interval-updates") + 1] == "2000" and "--fp16" in flags
    assert flags[flags.index("--keep-interval-updates") + 1] == "1"  # one mid-epoch checkpoint kept, not 150
    torch.save({"optimizer_history": [{"num_updates": 2000}]}, save_dir / "checkpoint_last.pt")
    fairseq_jobs.train(tmp_path, save_dir, **train)  # the requeued job resumes from update 2,000
    assert "--save-interval-updates" not in commands[1] and "--fp16" not in commands[1]  # a local run's command
    assert fairseq_jobs.count_repeated_updates(save_dir, log) == 350  # counted once, however often asked
    assert "# resuming from update 2000: the last run was cut short at update 2350, so 350 updates are trained again" \
        in log.read_text()
    assert fairseq_jobs.resumed_from(save_dir) == [2000]
    with open(log, "a") as handle:  # a run killed before its first log line: nothing counted, no negative figure
        handle.write("$ python -m fairseq_cli.train ...\nINFO | fairseq.trainer | Loaded checkpoint (epoch 5 @ 4000 "
                     "updates)\n")
    assert fairseq_jobs.count_repeated_updates(save_dir, log) == 350
    assert log.read_text().endswith("# resuming from update 4000: the last run was cut short before it logged an "
                                    "update beyond it\n")
    assert fairseq_jobs.resumed_from(save_dir) == [2000, 4000]


def test_detach_chains_the_plan_in_slurms_queue_and_list_reads_the_jobs_back(tmp_path, monkeypatch, capsys):
    from nat_kd.engine.cluster import job_notes

    first = 1000 + int(time.time()) % 100000 * 10  # ids no other test's jobs had (submitit caches their states)
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    root = tmp_path / "study"
    Runner(root).run([_plan()[0]])  # a: done before
    runner = Runner(root, launcher=JobLauncher(root, "slurm", FAST, detach=True))
    lines, failures = runner.launcher.submit_plan(runner, _plan())
    assert failures == [] and runner.ran == []
    jobs = {name: (job_id, dependency) for job_id, (name, dependency) in slurm.jobs().items()}
    b, c = jobs["b"][0], jobs["c"][0]
    assert set(jobs) == {"b", "c"} and jobs["b"][1] is None  # a is done: b waits for nothing
    assert lines == [f"b: submitted slurm job {b} ({Resources().describe()})",
                     f"c: submitted slurm job {c} ({Resources().describe()})"]
    assert Submitted.read(root / "jobs" / "b" / "submitted.json").job_id == b
    # with nothing done, each job waits for its dependencies' jobs; jobs still in the queue are not submitted again
    (slurm.folder / "states.json").write_text(json.dumps({b: "RUNNING"}))
    other = tmp_path / "other"
    runner = Runner(other, launcher=JobLauncher(other, "slurm", FAST, detach=True))
    lines, _ = runner.launcher.submit_plan(runner, _plan())
    jobs = {name: (job_id, dependency) for job_id, (name, dependency) in slurm.jobs().items() if job_id not in (b, c)}
    assert len(jobs) == 3 and jobs["a"][1] is None and jobs["b"][1] == f"afterok:{jobs['a'][0]}"
    assert "--kill-on-invalid-dep=yes" in (slurm.folder / f"job-{jobs['b'][0]}.sh").read_text()
    lines, _ = runner.launcher.submit_plan(runner, _plan())
    assert len(slurm.jobs()) == 5 and lines[0] == f"a: slurm job {jobs['a'][0]} already in the queue"
    assert job_notes(other, _plan()) == {"a": f"  (slurm job {jobs['a'][0]} PENDING)",
                                         "b": f"  (slurm job {jobs['b'][0]} PENDING)",
                                         "c": f"  (slurm job {jobs['c'][0]} PENDING)"}


def _plan_read_in_the_driver():
    """_plan with its first step bookkeeping that the driver runs itself (as choose's prepare and set steps)."""
    a, b, c = _plan()
    a.in_driver = True
    return [a, b, c]


def test_a_step_run_in_the_driver_is_never_a_job(tmp_path, monkeypatch):
    """Driven, detached or dry: a step marked in_driver runs in the driver, and the jobs that need it wait for no job
    of it."""
    from nat_kd.engine.cluster import dry_run

    driven = tmp_path / "driven"
    runner = Runner(driven, launcher=JobLauncher(driven, "submitit-local", FAST))
    records = runner.run(_plan_read_in_the_driver())
    assert "launcher" not in records["a"] and records["b"]["launcher"]["launcher"] == "submitit-local"
    assert not (driven / "jobs" / "a").exists() and (driven / "jobs" / "b").is_dir()
    Runner(tmp_path / "local").run(_plan())
    assert _outputs(driven) == _outputs(tmp_path / "local")

    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, 1000 + int(time.time()) % 100000 * 10 + 5)
    root = tmp_path / "detached"
    runner = Runner(root, launcher=JobLauncher(root, "slurm", FAST, detach=True))
    lines = dry_run(_plan_read_in_the_driver(), runner, FAST, detach=True)
    assert [line.split("  ")[0] for line in lines if not line.startswith(" ")] == ["a", "b", "c"]
    assert lines[0] == "a  [test: in the driver, no job]" and lines[1].startswith("b  [test: ")
    assert not any("--dependency" in line for line in lines) and not root.exists()  # a dry run runs nothing
    lines, failures = runner.launcher.submit_plan(runner, _plan_read_in_the_driver())
    jobs = {name: dependency for name, dependency in slurm.jobs().values()}
    assert failures == [] and jobs == {"b": None, "c": None}  # a ran here, so b waits for no job
    assert json.loads((root / "steps" / "a.json").read_text())["result"]["text"] == "1"
    a, b, c = _plan_read_in_the_driver()
    c.in_driver, c.deps = True, ["b"]
    with pytest.raises(ValueError, match="step c runs in the driver but depends on a job's step"):
        Runner(tmp_path / "wrong").run([a, b, c])


def test_a_detached_job_reads_its_dependencies_records_when_it_starts(tmp_path, monkeypatch):
    """What a job submitted by --detach runs once Slurm starts it: the step on its dependencies' records."""
    from nat_kd.engine.cluster import StepJob

    root = tmp_path / "study"
    plan = _plan()
    Runner(root).run(plan[:1])
    monkeypatch.setenv("SUBMITIT_DEBUG_JOB_ID", "7")  # submitit's environment of a job
    with pytest.raises(StepError, match="step b: its dependencies a have no record"):
        StepJob()(str(tmp_path / "empty"), plan[1], None, None, Resources(), "debug", 1, plan[:1])
    record = StepJob()(str(root), plan[1], None, None, Resources(), "debug", 1, plan[:1])
    assert record["result"]["text"] == "21" and record["launcher"]["job_id"] == "7"
    assert Runner(root).states(plan) == {"a": "done", "b": "done", "c": "to run"}


def _train(ctx, updates):
    """A training whose work folder says how far it got (as a checkpoint would), continued from there."""
    trained = ctx.work / "trained_to.txt"
    start = int(trained.read_text()) if trained.is_file() else 0
    trained.write_text(str(updates))
    return {"start": start, "outputs": [str(trained)]}


def _training(updates):
    from functools import partial

    return Step("t", "train", {"training": {"updates": updates}}, partial(_train, updates=updates),
                budget=("updates",))


def test_a_job_continues_a_training_whose_budget_grew(tmp_path, monkeypatch):
    from nat_kd.engine.cluster import StepJob

    out = tmp_path / "study"

    def started_at(updates):
        runner = Runner(out, launcher=JobLauncher(out, "submitit-local", FAST))
        return runner.run([_training(updates)])["t"]["result"]["start"]

    assert started_at(3) == 0 and started_at(6) == 3 and started_at(4) == 0
    # a job submitted by --detach, which works out its inputs when it starts, continues it too
    monkeypatch.setenv("SUBMITIT_DEBUG_JOB_ID", "7")
    assert StepJob()(str(out), _training(9), None, None, Resources(), "debug", 1, [])["result"]["start"] == 4


def test_detach_dry_run_shows_each_jobs_dependencies(tmp_path, capsys):
    code, out, err, _ = _paper_dry_run(tmp_path, capsys, '[launcher]\npartition = "gpu"\n', "--detach")
    assert code == 0, err
    assert "#SBATCH --dependency=afterok:prepare" in _job_block(out, "teacher.big")
    assert "#SBATCH --dependency=afterok:prepare:teacher.big" in _job_block(out, "distil.big.beam")
    assert "--dependency" not in _job_block(out, "prepare")


# ------------------------------------------------------------------ Slurm's end states, checked numbers, one schema


def _first_id():
    """Job ids no other test's jobs had: submitit's watcher keeps the states of every job it was asked about."""
    return 1000 + int(time.time() * 1000) % 10 ** 9 * 10


def _result(folder, job_id, value):
    """What a finished job leaves for its driver: submitit's result pickle."""
    import submitit
    from submitit.core.utils import cloudpickle_dump

    cloudpickle_dump(("success", value), submitit.SlurmJob(folder=folder, job_id=job_id).paths.result_pickle)


def _until(condition, what, seconds=60):
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.1)


def test_slurm_end_states_are_classified_once():
    from nat_kd.launch.jobs import classify

    states = {"PREEMPTED": "retried", "NODE_FAIL": "retried", "TIMEOUT": "retried", "BOOT_FAIL": "retried",
              "INTERRUPTED": "retried",  # submitit-local's job killed by a signal
              "REQUEUED": "active", "REQUEUE_HOLD": "active", "PENDING": "active", "RUNNING": "active",
              "COMPLETING": "active", "UNKNOWN": "active", "FAILED": "final", "OUT_OF_MEMORY": "final",
              "CANCELLED by 1000": "final", "COMPLETED": "final", "DEADLINE": "final"}
    assert {state: classify(state) for state in states} == states


def test_a_preempted_shard_is_resubmitted_and_the_array_is_collected(tmp_path, monkeypatch):
    """sacct says PREEMPTED (a cluster whose preemption cancels): the shard is submitted again, not waited on."""
    import threading

    from nat_kd.distill.cluster import ShardLauncher
    from nat_kd.distill.config import DistillConfig

    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    monkeypatch.setattr(ShardLauncher, "_check", lambda self: False)  # no teacher to load: the jobs are stand-ins
    cfg = DistillConfig(teachers=[str(tmp_path / "t.pt")], out_dir=str(tmp_path / "out"), num_shards=2)
    launcher = ShardLauncher(cfg, "slurm", ClusterConfig(LauncherSettings(poll_seconds=0.1)))
    merged = []
    driver = threading.Thread(target=lambda: merged.append(launcher.run()), daemon=True)
    driver.start()
    _until(lambda: slurm.jobs(), "the array was not submitted")
    slurm.set_states(**{f"{first}_0": "PREEMPTED", f"{first}_1": "RUNNING"})
    _until(lambda: len(slurm.jobs()) == 2, "the preempted shard was not resubmitted")
    again = str(first + 1)
    assert slurm.jobs()[again] == ("distil.out", None)  # one job, shard 0 of the same command
    assert "--array" not in (slurm.folder / f"job-{again}.sh").read_text()
    # the marker is written once sbatch has returned the new id: wait for it rather than race the driver
    _until(lambda: Submitted.read(tmp_path / "out.jobs" / "shard-0.submitted.json").job_id == again,
           "shard 0's marker does not name the resubmitted job")
    _result(tmp_path / "out.jobs", f"{first}_1", False)
    _result(tmp_path / "out.jobs", again, True)  # the last shard merged
    slurm.set_states(**{f"{first}_1": "COMPLETED", again: "COMPLETED"})
    driver.join(60)
    assert merged == [True] and len(slurm.jobs()) == 2


def test_a_preempted_step_is_resubmitted(tmp_path, monkeypatch):
    """The study's driven runner reads the same classification: a PREEMPTED step's job is submitted again."""
    import threading

    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    root = tmp_path / "study"
    records = []
    runner = Runner(root, launcher=JobLauncher(root, "slurm", FAST))
    driver = threading.Thread(target=lambda: records.append(runner.run([_plan()[0]])), daemon=True)
    driver.start()
    _until(lambda: slurm.jobs(), "the step was not submitted")
    slurm.set_states(**{str(first): "PREEMPTED"})
    _until(lambda: len(slurm.jobs()) == 2, "the preempted step was not resubmitted")
    record = {"result": {"text": "1"}, "wall_seconds": 1.0}
    _result(root / "jobs" / "a", str(first + 1), record)
    slurm.set_states(**{str(first + 1): "COMPLETED"})
    driver.join(60)
    assert records == [{"a": record}] and [name for name, _ in slurm.jobs().values()] == ["a", "a"]


def test_a_checkpoint_cut_short_by_a_preemption_is_replaced_before_training_resumes(tmp_path):
    """fairseq writes a save's first checkpoint atomically and copies it to checkpoint_last.pt in place: a job
    killed during that copy leaves checkpoint_last.pt truncated. Before resuming, it is replaced by the readable
    checkpoint of the most updates (the one it was copied from), and the log says so; with none readable, it
    goes and the training starts over."""
    import torch

    from nat_kd.engine import fairseq_jobs

    save_dir, log = tmp_path / "checkpoints", tmp_path / "log"
    save_dir.mkdir()
    log.write_text("")
    torch.save({"optimizer_history": [{"num_updates": 20}], "model": torch.zeros(1000)}, save_dir / "checkpoint_5_20.pt")
    torch.save({"optimizer_history": [{"num_updates": 16}]}, save_dir / "checkpoint_best.pt")
    torch.save({"optimizer_history": [{"num_updates": 99}]}, save_dir / "checkpoint_bleu_best.pt")  # the curve's
    copied = (save_dir / "checkpoint_5_20.pt").read_bytes()
    (save_dir / "checkpoint_last.pt").write_bytes(copied[: len(copied) // 2])
    fairseq_jobs.repair_last_checkpoint(save_dir, log)
    assert (save_dir / "checkpoint_last.pt").read_bytes() == copied
    assert log.read_text() == ("# checkpoint_last.pt was cut short (a kill while fairseq copied it): replaced by "
                               "checkpoint_5_20.pt, update 20\n")
    fairseq_jobs.repair_last_checkpoint(save_dir, log)  # a readable one is left as it is
    assert log.read_text().count("\n") == 1
    for other in ("checkpoint_5_20.pt", "checkpoint_best.pt"):
        (save_dir / other).write_bytes(b"PK")
    (save_dir / "checkpoint_last.pt").write_bytes(copied[:100])
    fairseq_jobs.repair_last_checkpoint(save_dir, log)
    assert not (save_dir / "checkpoint_last.pt").exists() and "training starts over" in log.read_text()


class _EndedJob:
    """A Slurm job whose process has ended, as submitit shows it: its result file (if it left one), what its
    result() raises, and the states sacct gives, one a call (the last one repeated: ``asked_by``)."""

    def __init__(self, folder: Path, states: list[str], error: str | None):
        from submitit.core.utils import FailedJobError, UncompletedJobError

        self.job_id, self.states, self.calls = "42_3", states, 0
        result = folder / "42_3_0_result.pkl"
        self.paths = type("Paths", (), {"result_pickle": result, "stderr": folder / "42_3_0_log.err"})
        if error is not None:
            result.write_text("an error")
            self.raised = FailedJobError(error)
        else:
            self.raised = UncompletedJobError("has not produced any output (state: ...)")

    def asked_by(self, scheduler):
        """``scheduler`` whose sacct calls answer this job's states."""
        def sacct():
            self.calls += 1
            scheduler._states[self.job_id] = self.states[min(self.calls, len(self.states)) - 1]

        scheduler._ask_sacct = sacct
        return scheduler

    def result(self):
        raise self.raised


@pytest.mark.parametrize("states, error, message, retry", [
    # the job's own error is the cause, whatever sacct says when the driver asks (often RUNNING still)
    (["RUNNING"], "Traceback ...\nnat_kd.errors.SettingsError: bad teacher",
     "slurm job 42_3: nat_kd.errors.SettingsError: bad teacher", None),
    # no result: the scheduler's end says why
    (["RUNNING", "OUT_OF_MEMORY"], None, "slurm job 42_3, state OUT_OF_MEMORY: it left no result", None),
    (["RUNNING", "PREEMPTED"], None, "slurm job 42_3 was stopped from outside its work (state PREEMPTED)",
     "PREEMPTED"),
    # an error after the scheduler's SIGTERM: the state sacct settles on, not the error, decides
    (["RUNNING", "RUNNING", "PREEMPTED"], "nat_kd.launch.signals.JobSignalled: step t: ... RuntimeError: exit status -15",
     "slurm job 42_3 was stopped from outside its work (signalled (SIGTERM), state PREEMPTED)", "PREEMPTED"),
    (["RUNNING", "NODE_FAIL"], "nat_kd.launch.signals.JobSignalled: shard 0: ... BrokenProcessPool",
     "slurm job 42_3 was stopped from outside its work (signalled (SIGTERM), state NODE_FAIL)", "NODE_FAIL"),
    (["RUNNING", "CANCELLED by 1000"], "nat_kd.launch.signals.JobSignalled: step t: ... exit status -15",
     "slurm job 42_3, state CANCELLED by 1000: nat_kd.launch.signals.JobSignalled: step t: ... exit status -15",
     None),
])
def test_how_a_job_ended_is_the_schedulers_end_state_first(tmp_path, states, error, message, retry):
    from nat_kd.launch.jobs import JobFailed, Scheduler

    job = _EndedJob(tmp_path, states, error)
    scheduler = job.asked_by(Scheduler("slurm", LauncherSettings(poll_seconds=0.01, unknown_seconds=5)))
    with pytest.raises(JobFailed) as failed:
        scheduler.outcome(job)
    assert str(failed.value) == message and failed.value.retry == retry and not failed.value.requeued
    assert failed.value.state == states[-1]


def test_a_signalled_job_that_slurm_requeued_itself_is_waited_on_again(tmp_path):
    """Preemption that requeues: the job's killed run left an error; sacct says PENDING (the same id, queued
    again). The stale result is set aside, so that waiting on the job goes on until its next run's."""
    from nat_kd.launch.jobs import JobFailed, Scheduler

    job = _EndedJob(tmp_path, ["RUNNING", "REQUEUED"], "nat_kd.launch.signals.JobSignalled: step t: ...")
    scheduler = job.asked_by(Scheduler("slurm", LauncherSettings(poll_seconds=0.01, unknown_seconds=5)))
    with pytest.raises(JobFailed) as failed:
        scheduler.outcome(job)
    assert failed.value.requeued and not job.paths.result_pickle.exists()
    assert [p.name.split(".")[0] for p in tmp_path.iterdir()] == ["42_3_0_result"]  # kept, beside it


def test_a_job_neither_sacct_nor_squeue_knows_counts_as_ended_after_a_bounded_wait(tmp_path, monkeypatch, caplog):
    """An id sacct has no line for (or sacct failing): squeue is asked; known to neither for unknown_seconds,
    the job counts as ended, with one warning naming it."""
    from nat_kd.launch.jobs import NOT_FOUND, Scheduler

    SlurmStandIn(tmp_path / "slurm", monkeypatch, _first_id())
    job = _EndedJob(tmp_path, ["UNKNOWN"], None)
    scheduler = job.asked_by(Scheduler("slurm", LauncherSettings(poll_seconds=0.01, unknown_seconds=0.5)))
    started = time.monotonic()
    states = []
    while not states or states[-1] == "UNKNOWN":
        states.append(scheduler.state(job))
        assert time.monotonic() - started < 10, "it waited on for ever"
    assert states[-1] == NOT_FOUND and time.monotonic() - started >= 0.5
    warnings = [r.getMessage() for r in caplog.records if "neither sacct nor squeue" in r.getMessage()]
    assert warnings == ["slurm job 42_3: neither sacct nor squeue has known it for 0.5 s; counted as ended"]


@pytest.mark.parametrize("table, key, value, message", [
    ("launcher", "max_jobs", "0", "must be 1 or more"),
    ("launcher", "max_jobs", "-1", "must be 1 or more"),
    ("launcher", "max_retries", "-1", "must be 0 or more"),
    ("launcher", "poll_seconds", "0", "must be more than 0"),
    ("resources.train", "gpus", "-1", "must be 0 or more"),
    ("resources.train", "cpus", "0", "must be 1 or more"),
    ("resources.train", "mem_gb", "0", "must be 0.001 or more"),
    ("resources.train", "hours", "-5", "must be more than 0"),
    ("resources.train", "save_updates", "-1", "must be 0 or more"),
    ("resources.train", "gpu_type", '"h100:2"', 'a GPU type alone (e.g. "h100"); the count is gpus'),
    ("launcher", "gpu_type", '"a100:1"', 'a GPU type alone (e.g. "h100"); the count is gpus'),
])
def test_every_number_of_a_cluster_file_is_range_checked(tmp_path, table, key, value, message):
    path = tmp_path / "cluster.toml"
    path.write_text(f"[{table}]\n{key} = {value}\n")
    with pytest.raises(LaunchError) as err:
        read_cluster_file(path)
    shown = repr(tomllib.loads(f"x = {value}")["x"])
    assert str(err.value).startswith(f"{path}: [{table}].{key} = {shown}: {message}") and "\n" not in str(err.value)


def _generator_dry_run(tmp_path, capsys, cluster_text, *extra):
    """The generator's dry run of a 16-shard array with ``cluster_text`` as its cluster file."""
    from nat_kd.distill.__main__ import main

    cluster = tmp_path / "generator.toml"
    cluster.write_text(cluster_text)
    code = main(["--teacher-path", str(tmp_path / "teacher.pt"), "--data", str(tmp_path / "bin"), "--split", "train",
                 "--out", str(tmp_path / "distil" / "beam5"), "--num-shards", "16", "--launcher", "slurm", "--cluster",
                 str(cluster), "--dry-run", *extra])
    out, err = capsys.readouterr()
    return code, out, err, cluster


def test_a_cpu_step_asking_for_a_gpu_is_refused(tmp_path, capsys):
    code, out, err, cluster = _paper_dry_run(tmp_path, capsys, "[resources.analysis]\ngpus = 1\n")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {cluster}: [resources.analysis].gpus = 1: analysis jobs run on CPUs only"), err


def test_the_generator_refuses_a_misspelt_table_as_the_study_does(tmp_path, capsys):
    code, out, err, cluster = _generator_dry_run(tmp_path, capsys, "[resources.distill]\nhours = 2\n")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {cluster}: [resources.distill] is neither a job kind (prepare, train, distil, "
                          "mix, analysis, speed, modes, merge) nor a step"), err
    code, _, err, cluster = _paper_dry_run(tmp_path, capsys, "[resources.distill]\nhours = 2\n")
    assert code == 2 and f"{cluster}: [resources.distill] is neither a job kind" in err, err
    code, _, err, cluster = _generator_dry_run(tmp_path, capsys, "[resources.distil]\nhour = 2\n")
    assert code == 2 and f"{cluster}: [resources.distil]: unknown key(s) hour" in err, err


def test_one_cluster_file_serves_the_study_and_the_generator(tmp_path, capsys):
    """What is the other command's is accepted and ignored with one note; fp16 of the study's distil steps
    points the generator to its own --fp16."""
    text = ('[launcher]\npartition = "gpu"\n[resources.train]\nhours = 96\nfp16 = true\nsave_updates = 1000\n'
            '[resources.distil]\nhours = 12\nfp16 = true\n[resources.analysis]\nmem_gb = 64\n'
            '[resources."teacher.big"]\ngpus = 4\n[resources.merge]\nhours = 1\n')
    code, out, err, cluster = _paper_dry_run(tmp_path, capsys, text)
    assert code == 0, err
    assert err.strip() == (f"note: {cluster}: ignored here, for python -m nat_kd.generate_distilled: "
                           "[resources.merge]")
    assert "[distil: 1 GPU, 8 CPU, 32 GB, 12 h, fp16]" in out
    code, out, err, _ = _generator_dry_run(tmp_path, capsys, text)
    assert code == 0, err
    assert err.strip() == (f"note: {tmp_path / 'generator.toml'}: ignored here, for python -m nat_kd.study: "
                           "[resources.train], [resources.distil] fp16 (the teacher's precision here is --fp16), "
                           '[resources.analysis], [resources."teacher.big"]')
    assert "an array of 16 shard job(s) [1 GPU, 8 CPU, 32 GB, 12 h each]" in out
    assert "[0 GPU, 4 CPU, 32 GB, 1 h]" in out and "#SBATCH --partition=gpu" in out


def _detached_plan_whose_first_job_failed(tmp_path, monkeypatch):
    """_plan() submitted with --detach to the stand-in Slurm, then a's job FAILED, b's PENDING on it, c's
    RUNNING; returns the stand-in, the jobs by step, and a rerun of the same detached submission."""
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, _first_id())
    root = tmp_path / "study"
    launcher = JobLauncher(root, "slurm", FAST, detach=True)
    launcher.submit_plan(Runner(root, launcher=launcher), _plan())
    jobs = {name: job_id for job_id, (name, _) in slurm.jobs().items()}
    slurm.set_states(**{jobs["a"]: "FAILED", jobs["b"]: "PENDING", jobs["c"]: "RUNNING"})

    def rerun():
        time.sleep(2.1)  # submitit asks sacct again at most every 2 s
        launcher = JobLauncher(root, "slurm", FAST, detach=True)
        return launcher.submit_plan(Runner(root, launcher=launcher), _plan())

    return slurm, jobs, rerun


def test_a_detached_rerun_cancels_a_queued_job_whose_dependency_cannot_be_submitted_again(tmp_path, monkeypatch):
    """b waits (afterok) on a's job, which failed, and sbatch now refuses a: b's job could never start, so it
    is cancelled, and the line says so."""
    slurm, jobs, rerun = _detached_plan_whose_first_job_failed(tmp_path, monkeypatch)
    slurm.refuse("a")
    lines, failures = rerun()
    assert slurm.cancelled() == [jobs["b"]] and len(slurm.jobs()) == 3  # nothing new in the queue
    assert failures[0].startswith("step a failed: ") and "Invalid account" in failures[0]
    assert failures[1] == (f"step b not submitted: it needs a; cancelled slurm job {jobs['b']}, which waited on a "
                           "job of a that will not run")
    assert lines == [f"c: slurm job {jobs['c']} already in the queue"]


def test_a_study_step_named_without_a_dot_is_the_studys_for_the_generator_too(tmp_path, capsys):
    from nat_kd.launch.settings import KINDS, STUDY, STUDY_STEPS_WITHOUT_A_DOT
    from nat_kd.study import config as study_config
    from nat_kd.study.plan import build_plan

    dotless = {step.name for profile in study_config.profile_names()
               for step in build_plan(study_config.load(profile), tmp_path / profile)
               if "." not in step.name and step.name not in KINDS[STUDY]}
    assert dotless == set(STUDY_STEPS_WITHOUT_A_DOT)
    code, out, err, cluster = _generator_dry_run(tmp_path, capsys, "[resources.training_speed]\ncpus = 4\n")
    assert code == 0 and err.strip() == (f"note: {cluster}: ignored here, for python -m nat_kd.study: "
                                         "[resources.training_speed]"), err


def test_a_detached_rerun_resubmits_a_queued_job_whose_dependency_failed(tmp_path, monkeypatch):
    """b waits (afterok) on a's job, which failed: the rerun submits a again, and b's job, which can never
    start, is cancelled and submitted again after a's new job."""
    slurm, jobs, rerun = _detached_plan_whose_first_job_failed(tmp_path, monkeypatch)
    lines, failures = rerun()
    again = {name: (job_id, dependency) for job_id, (name, dependency) in slurm.jobs().items()
             if job_id not in jobs.values()}
    assert failures == [] and set(again) == {"a", "b"} and slurm.cancelled() == [jobs["b"]]
    assert again["b"][1] == f"afterok:{again['a'][0]}"
    assert lines[1] == (f"b: cancelled slurm job {jobs['b']}, which waited on a failed job of a; submitted slurm job "
                        f"{again['b'][0]} after job(s) {again['a'][0]} ({Resources().describe()})")
    assert lines[2] == f"c: slurm job {jobs['c']} already in the queue"


def test_every_kind_of_step_has_its_defaults_and_a_gpu_type_is_recorded_as_the_job_got_it():
    from nat_kd.study import config as study_config
    from nat_kd.engine.cluster import STEP_RESOURCES, step_resources
    from nat_kd.study.plan import build_plan

    kinds = {s.kind for profile in study_config.profile_names()
             for s in build_plan(study_config.load(profile), Path("r"))}
    assert {"speed", "mix"} <= kinds and kinds <= set(STEP_RESOURCES)
    cluster = cluster_config({"launcher": {"gpu_type": "a100"}, "resources": {"distil": {"gpu_type": "h100"}}})
    step = lambda name, kind: Step(name, kind, {}, None)  # noqa: E731
    assert step_resources(cluster, step("teacher.big", "train")).gpu_type == "a100"  # what the job asks for
    assert step_resources(cluster, step("distil.big.beam", "distil")).gpu_type == "h100"
    assert step_resources(cluster, step("analysis", "analysis")).gpu_type is None  # a CPU job gets none


def test_a_resumable_command_stopped_by_sigterm_says_how_to_go_on(tmp_path):
    """The local study driver dies with SIGTERM as before (its running jobs with it), saying first what to do."""
    ready = tmp_path / "ready"
    code = ("import sys, time; from pathlib import Path; from nat_kd.cli import run\n"
            f"def body():\n    Path({str(ready)!r}).touch()\n    time.sleep(60)\n"
            "sys.exit(run(body, resumable=True))\n")
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    _until(ready.exists, "the command did not start")
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=30)
    assert err.strip().splitlines()[-1:] == ["stopped; rerun the same command to go on"]
    assert driver.returncode == -signal.SIGTERM  # killed by it, as its jobs are


def test_the_docs_example_cluster_file_serves_both_commands(tmp_path, capsys):
    text = (ROOT / "docs" / "cluster.toml").read_text()
    for page in ("cluster.md", "study.md", "generate_distilled.md"):
        assert "cluster.toml" in (ROOT / "docs" / page).read_text()
    assert f"```toml\n{text}```" in (ROOT / "docs" / "cluster.md").read_text()  # shown in full
    code, out, err, _ = _paper_dry_run(tmp_path, capsys, text, "--detach")
    assert code == 0 and "[resources.merge]" in err and len(err.strip().splitlines()) == 1, err
    assert "#SBATCH --dependency=afterok:prepare" in _job_block(out, "teacher.big")
    code, out, err, _ = _generator_dry_run(tmp_path, capsys, text, "--fp16")
    assert code == 0 and len(err.strip().splitlines()) == 1 and "--array=0-15%" in out, err


# ------------------------------------------------------------------ preemption of real jobs, signals, lost jobs


def _preemptible_teacher_plan(out, corpus, updates=150):
    """prepare and the micro profile's teacher t1, trained long enough to be preempted midway."""
    from dataclasses import replace

    from nat_kd.study import config as study_config
    from nat_kd.study.plan import build_plan

    cfg = study_config.load("micro")
    t1 = cfg.teachers[0]
    cfg = replace(cfg, teachers=(replace(t1, training=replace(t1.training, updates=updates)),))
    return [s for s in build_plan(cfg, out / "results", corpus) if s.name in ("prepare", "teacher.t1")]


def _checkpoint_updates(path):
    from nat_kd.engine.curve import checkpoint_updates

    try:
        return checkpoint_updates(path)
    except Exception:  # noqa: BLE001 - being written
        return 0


@pytest.mark.slow
def test_a_step_preempted_while_fairseq_train_runs_is_resubmitted_and_resumes_from_its_checkpoint(
        micro_local, tmp_path, monkeypatch):
    """As Slurm preempts: PREEMPTED, SIGTERM to every process of the job, SIGKILL after the grace time. The
    fairseq-train child dies of the SIGTERM and the step's work fails; the job, which noted the signal, says
    so, and the driver resubmits the step, which continues from its last checkpoint."""
    import shutil
    import threading

    corpus, local, _ = micro_local
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first, run=True, grace=1.0)
    out = tmp_path / "study"
    (out / "steps").mkdir(parents=True)
    shutil.copyfile(local / "steps" / "prepare.json", out / "steps" / "prepare.json")
    cluster = ClusterConfig(LauncherSettings(poll_seconds=0.2, unknown_seconds=30),
                            {"train": {"cpus": 1, "gpus": 0, "save_updates": 10}})
    runner = Runner(out, launcher=JobLauncher(out, "slurm", cluster))
    records, errors = [], []

    def drive():
        try:
            records.append(runner.run(_preemptible_teacher_plan(out, corpus)))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    last = out / "work" / "teacher.t1" / "checkpoints" / "checkpoint_last.pt"
    _until(lambda: _checkpoint_updates(last) >= 20 or not driver.is_alive(), "no checkpoint was saved", 300)
    assert driver.is_alive() and slurm.running(str(first)), "the training ended before it could be preempted"
    saved = _checkpoint_updates(last)
    slurm.preempt(str(first))
    driver.join(600)
    assert not errors, errors
    record = records[0]["teacher.t1"]
    assert [name for name, _ in slurm.jobs().values()] == ["teacher.t1", "teacher.t1"]
    assert record["launcher"]["jobs"] == [{"job_id": str(first), "state": "PREEMPTED"},
                                          {"job_id": str(first + 1), "state": "COMPLETED"}]
    resumed = record["result"]["resumed_from"]
    assert len(resumed) == 1 and saved <= resumed[0] < 150  # from its last checkpoint, not from update 0
    log = (out / "logs" / "teacher.t1.log").read_text()
    assert f"# resuming from update {resumed[0]}" in log and _checkpoint_updates(last) == 150


def _group_processes(slurm, task):
    """The processes of a running stand-in job (its process group)."""
    group = int((slurm.folder / f"pgid-{task}").read_text())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_a_generator_shard_preempted_while_its_workers_decode_is_resubmitted(micro_local, tmp_path, monkeypatch):
    """A shard decoding with two worker processes: SIGTERM kills the workers, the shard's pool breaks and its
    work fails. Preempted, the shard is resubmitted, resumes from its saved chunks, and the set is the one an
    unsharded local run makes; its meta.json lists every job with its end state."""
    _, local, _ = micro_local
    reference = _set_bytes(local / "work" / "distil.t1.beam" / "data")
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first, run=True, grace=1.0)
    cluster = tmp_path / "cluster.toml"
    cluster.write_text("[launcher]\npoll_seconds = 0.2\n[resources.distil]\ngpus = 0\ncpus = 2\n")
    out = tmp_path / "sharded"
    args = _generator_args(micro_local, out, "--num-shards", "2", "--chunk-sentences", "10", "--cluster", str(cluster),
                           "--launcher", "slurm", "--workers", "2")
    driver = subprocess.Popen([sys.executable, "-m", "nat_kd.generate_distilled", *args], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    task = f"{first}_0"
    # the shard's job: bash, srun's python, and its two workers
    _until(lambda: driver.poll() is not None or ((slurm.folder / f"pgid-{task}").is_file()
                                                and len(_group_processes(slurm, task)) >= 4),
           "the shard's workers never started", 300)
    assert driver.poll() is None, f"the generator ended before its shard could be preempted: {driver.stdout.read()}"
    slurm.preempt(task)
    output, _ = driver.communicate(timeout=600)
    assert driver.returncode == 0, output
    assert _set_bytes(out) == reference
    jobs = json.loads((out / "meta.json").read_text())["launcher"]["jobs"]
    assert {"shard": 0, "job_id": task, "state": "PREEMPTED"} in jobs
    assert {"shard": 0, "job_id": str(first + 1), "state": "COMPLETED"} in jobs
    assert {"shard": 1, "job_id": f"{first}_1", "state": "COMPLETED"} in jobs and len(jobs) == 3


SIGNALLED_DRIVER = """
import logging
import sys
from functools import partial
from pathlib import Path
sys.path.insert(0, {tests!r})
import test_cluster as t
from nat_kd.launch.settings import ClusterConfig, LauncherSettings
from nat_kd.engine.cluster import JobLauncher, run_stoppable
from nat_kd.engine.runner import Runner, Step
root = Path({root!r})
logging.basicConfig(level=logging.INFO)
plan = [Step(name, "test", {{}}, partial(t._wait_for_file, deps=[], value=name, flag=str(root / "go")))
        for name in ("a", "b", "c")]
launcher = JobLauncher(root, "slurm", ClusterConfig(LauncherSettings(poll_seconds=0.2, max_jobs=3)))
run_stoppable(Runner(root, launcher=launcher), plan, launcher)
"""


@pytest.mark.slow
def test_two_signals_a_millisecond_apart_never_orphan_a_job(tmp_path, monkeypatch):
    """SIGTERM twice, 1 ms apart, to a driver of three jobs, at moments from before its first submission to
    after its last: every job it submitted is cancelled (scancel, its marker gone) or named as left running
    (its marker kept), and its last line says which."""
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, _first_id())
    for attempt in range(8):
        root = tmp_path / f"study{attempt}"
        root.mkdir()
        log = root / "driver.log"
        before = set(slurm.jobs())
        with open(log, "w") as streams:
            driver = subprocess.Popen([sys.executable, "-c", SIGNALLED_DRIVER.format(tests=str(ROOT / "tests"),
                                                                                     root=str(root))],
                                      cwd=ROOT, stdout=streams, stderr=subprocess.STDOUT)
        submitted = attempt % 4  # the signals come once this many jobs are in the queue
        _until(lambda: len(set(slurm.jobs()) - before) >= submitted or driver.poll() is not None,
               "the driver did not submit", 120)
        time.sleep(0.05 * attempt)
        driver.send_signal(signal.SIGTERM)
        time.sleep(0.001)
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=120)
        output = log.read_text()
        mine = {job_id: name for job_id, (name, _) in slurm.jobs().items() if job_id not in before}
        line = next((x for x in output.splitlines() if x.startswith("jobs: ")), None)
        if not mine:
            continue  # stopped before submitting (maybe before it could say so)
        assert line is not None, output
        for job_id, name in mine.items():
            label = f"{name} (slurm job {job_id})"
            marker = root / "jobs" / name / "submitted.json"
            if job_id in slurm.cancelled():
                assert label in line.split("cancelled: ")[1].split(";")[0] and not marker.exists(), (line, output)
            else:
                assert label in line.split("left running: ")[1].split(";")[0] and marker.exists(), (line, output)


def test_a_job_that_sacct_does_not_know_is_not_waited_on_for_ever(tmp_path, monkeypatch):
    """A step's marker names a job id sacct has never had (and squeue neither): the rerun waits
    unknown_seconds, counts it as ended (one warning), and submits the step again, which runs."""
    from nat_kd.engine.runner import step_fingerprint

    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first, run=True)
    root = tmp_path / "study"
    step = _plan()[0]
    marker = root / "jobs" / "a" / "submitted.json"
    marker.parent.mkdir(parents=True)
    Submitted("slurm", "999999", str(marker.parent), step_fingerprint(step, {})).write(marker)
    cluster = ClusterConfig(LauncherSettings(poll_seconds=0.2, unknown_seconds=1))
    started = time.monotonic()
    records = Runner(root, launcher=JobLauncher(root, "slurm", cluster)).run([step])
    assert time.monotonic() - started < 120
    assert records["a"]["result"]["text"] == "1" and list(slurm.jobs()) == [str(first)]
    assert records["a"]["launcher"]["jobs"] == [{"job_id": "999999", "state": "NOT_FOUND"},
                                                {"job_id": str(first), "state": "COMPLETED"}]


WARNING_DRIVER = """
import logging, sys, time
sys.path.insert(0, {tests!r})
from nat_kd.cli import setup_logging
from nat_kd.launch.jobs import Scheduler
from nat_kd.launch.settings import LauncherSettings
from nat_kd.launch.signals import submitit_warnings_once
import submitit
setup_logging([])
submitit_warnings_once()
scheduler = Scheduler("slurm", LauncherSettings(poll_seconds=0.01, unknown_seconds=60))
job = submitit.SlurmJob(folder={folder!r}, job_id="{job_id}")
for _ in range(5):
    scheduler.state(job)
    time.sleep(0.02)
"""


def test_a_failing_saccts_warning_is_printed_once(tmp_path, monkeypatch):
    """sacct failing at every call: one warning, and sacct's own error is not printed at each call."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    slurm.accounting(False)
    found = subprocess.run([sys.executable, "-c", WARNING_DRIVER.format(tests=str(ROOT / "tests"), folder=str(tmp_path),
                                                                      job_id=first)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert len(slurm.calls("sacct")) >= 5
    printed = found.stdout + found.stderr
    assert printed.count("sacct does not answer") == 1 and printed.count("accounting storage is disabled") == 1, printed


@pytest.mark.parametrize("text, message", [
    ("[resources.train]\nhours = inf\n", "[resources.train].hours = inf: expected a finite number"),
    ("[resources.train]\nhours = nan\n", "[resources.train].hours = nan: expected a finite number"),
    ("[resources.train]\nmem_gb = inf\n", "[resources.train].mem_gb = inf: expected a finite number"),
    ("[launcher]\npoll_seconds = nan\n", "[launcher].poll_seconds = nan: expected a finite number"),
    ("[launcher]\nsetup = [1, 2]\n", "[launcher].setup[0] = 1: expected a string"),
    ("[launcher]\nunknown_seconds = -1\n", "[launcher].unknown_seconds = -1: must be more than 0"),
    ("[resources.train]\nsbatch = {time = \"2-00:00:00\"}\nhours = 24\n",
     "[resources.train].sbatch: time = '2-00:00:00' would silently override hours (this table has hours = 24): "
     "set hours instead"),
    ("[launcher]\nsbatch = {partition = \"gpu\"}\n",
     "[launcher].sbatch: partition = 'gpu' would silently override [launcher] partition: set [launcher] partition "
     "instead"),
    ("[resources.train]\nsbatch = {mail_user = inf}\n", "[resources.train].sbatch.mail_user = inf: expected a finite "
                                                       "number"),
    ("[resources.train]\nsbatch = {output = \"x.log\"}\n", "[resources.train].sbatch: output is set by the command"),
    # numbers a job cannot take although they are finite: an overflowing time limit, a wait past any timer, a
    # memory that sbatch would write as --mem=0MB (all of a node's memory)
    ("[resources.train]\nhours = 1e308\n", "[resources.train].hours = 1e+308: must be 8760 or less (a year)"),
    ("[launcher]\npoll_seconds = 1e300\n", "[launcher].poll_seconds = 1e+300: must be 3600 or less (an hour"),
    ("[launcher]\nunknown_seconds = 1e300\n", "[launcher].unknown_seconds = 1e+300: must be 86400 or less (a day"),
    ("[resources.train]\nmem_gb = 0.0005\n", "[resources.train].mem_gb = 0.0005: must be 0.001 or more (less is "
                                             "--mem=0MB, which Slurm reads as all of a node's memory)"),
    ("launcher = [1, 2]\n", "launcher = [1, 2]: expected a table [launcher] of partition, account, max_jobs, ..."),
    ("resources = 5\n", "resources = 5: expected tables [resources.KIND] of gpus, cpus, mem_gb, hours, ..."),
])
def test_values_toml_allows_but_a_job_cannot_take_are_one_line(tmp_path, capsys, text, message):
    """inf, nan, a list of the wrong elements, an sbatch option that a typed key sets: one line naming the file,
    the table and the key, exit 2, nothing submitted; through the study's command as a user meets them."""
    code, out, err, cluster = _paper_dry_run(tmp_path, capsys, text)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {cluster}: {message}"), err


def test_a_binary_cluster_file_is_refused_in_one_line(tmp_path, capsys):
    from nat_kd.study.__main__ import main

    cluster = tmp_path / "cluster.toml"
    cluster.write_bytes(b"[launcher]\n\x1f\x8b\x08\x00\xff\xfe")  # a gzip header, not text
    code = main(["paper", "--launcher", "slurm", "--cluster", str(cluster), "--dry-run", "--out", str(tmp_path / "p")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err == (f"error: {cluster}: not a text file (byte 12 is not UTF-8): give a "
                                               "TOML settings file\n")


def test_a_kinds_own_partition_in_its_sbatch_table_reaches_its_jobs_alone(tmp_path, capsys):
    code, out, err, _ = _paper_dry_run(tmp_path, capsys, '[launcher]\npartition = "cpu"\n'
                                                         '[resources.train]\nsbatch = {partition = "gpu"}\n')
    assert code == 0, err
    assert "#SBATCH --partition=gpu" in _job_block(out, "teacher.tiny")
    assert "#SBATCH --partition=cpu" in _job_block(out, "prepare")


def test_dry_run_honours_only(tmp_path, capsys):
    code, out, err, _ = _paper_dry_run(tmp_path, capsys, "", "--only", "teacher.tiny")
    assert code == 0, err
    headings = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert headings == ["prepare", "teacher.tiny"]


# ------------------------------------------------------------------ what independent reviews broke (issue 71)


STOPPED_DRIVER = """
import logging, os, signal, sys, threading, time
from functools import partial
from pathlib import Path
sys.path.insert(0, {tests!r})
import test_cluster as t
from nat_kd.cli import run
from nat_kd.engine.cluster import JobLauncher, run_stoppable, submit_detached
from nat_kd.engine.runner import Runner, Step
root = Path({root!r})
logging.basicConfig(level=logging.INFO)
how = {how!r}
plan = t._plan() if how == "detached" else [t._plan()[0]]
launcher = JobLauncher(root, "slurm", t.FAST, detach=how == "detached")
if how == "in a worker thread":  # both signals taken by a thread that is not the main one, as the kernel may
    def fire():
        while not (root / "fire").exists():
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        time.sleep(0.001)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Thread(target=fire, daemon=True).start()
if how == "while the line is made":  # one more signal just as the driver makes its last line
    made = JobLauncher.stop_report
    def report(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return made(self)
    JobLauncher.stop_report = report
runner = Runner(root, launcher=launcher)
if how == "detached":
    sys.exit(run(lambda: submit_detached(launcher, runner, plan, "then --list"), resumable=True))
sys.exit(run(lambda: run_stoppable(runner, plan, launcher), resumable=True))
"""


def _stopped_driver(root, how, **popen):
    """A study driver of the stand-in's Slurm in its own process (as ``python -m nat_kd.study`` runs it), its
    output in root/driver.log."""
    root.mkdir()
    with open(root / "driver.log", "w") as streams:
        return subprocess.Popen([sys.executable, "-c", STOPPED_DRIVER.format(tests=str(ROOT / "tests"), root=str(root),
                                                                          how=how)],
                                cwd=ROOT, stdout=streams, stderr=subprocess.STDOUT, **popen)


def _ended(driver, root, seconds=30):
    """The driver's output once it has ended, within ``seconds`` (else it is killed, and the test fails)."""
    try:
        driver.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait()
        pytest.fail(f"the driver did not stop within {seconds} s: {(root / 'driver.log').read_text()}")
    return (root / "driver.log").read_text()


def test_two_signals_taken_by_a_worker_thread_stop_the_driver(tmp_path, monkeypatch):
    """SIGINT then SIGTERM 1 ms later, both handled by a thread other than the main one (the kernel gives a
    process's signal to any thread that takes it, e.g. when the main thread has one pending already): the main
    thread, waiting on its steps, still acts on them within a bounded time; the job is cancelled, the line says
    so."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    root = tmp_path / "study"
    driver = _stopped_driver(root, "in a worker thread")
    _until(lambda: (root / "jobs" / "a" / "submitted.json").exists() or driver.poll() is not None, "not submitted")
    (root / "fire").touch()
    output = _ended(driver, root)
    assert f"jobs: cancelled: a (slurm job {first})" in output and slurm.cancelled() == [str(first)], output


def test_a_signal_while_the_last_line_is_made_does_not_lose_it(tmp_path, monkeypatch):
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    root = tmp_path / "study"
    driver = _stopped_driver(root, "while the line is made")
    _until(lambda: (root / "jobs" / "a" / "submitted.json").exists() or driver.poll() is not None, "not submitted")
    driver.send_signal(signal.SIGTERM)
    output = _ended(driver, root)
    assert f"jobs: cancelled: a (slurm job {first})" in output and slurm.cancelled() == [str(first)], output
    assert "signal 15 again: still stopping the jobs" in output


def test_a_detached_driver_signalled_during_sbatch_leaves_a_marker_and_the_rerun_no_duplicate(tmp_path, monkeypatch):
    """--detach, SIGTERM while sbatch has queued a job but not yet printed its id: the driver stops once the job's
    marker is written, naming the job it leaves in the queue, and a rerun finds it instead of submitting it
    again."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    slurm.hold_sbatch(True)
    root = tmp_path / "study"
    driver = _stopped_driver(root, "detached")
    _until(lambda: slurm.held() or driver.poll() is not None, "sbatch was not called")
    driver.send_signal(signal.SIGTERM)
    slurm.hold_sbatch(False)
    slurm.release_sbatch()
    output = _ended(driver, root)
    queued = {name: job_id for job_id, (name, _) in slurm.jobs().items()}
    assert list(queued) == ["a"] and f"jobs: left running: a (slurm job {first})" in output, output
    assert Submitted.read(root / "jobs" / "a" / "submitted.json").job_id == str(first)
    runner = Runner(root, launcher=JobLauncher(root, "slurm", FAST, detach=True))
    lines, _ = runner.launcher.submit_plan(runner, _plan())
    assert lines[0] == f"a: slurm job {first} already in the queue" and len(slurm.jobs()) == 3


def test_a_group_signal_during_sbatch_never_leaves_a_job_the_driver_did_not_learn_of(tmp_path, monkeypatch):
    """Ctrl-C in the driver's terminal signals its whole process group, sbatch too: sbatch, which has queued the
    job and not yet printed its id, still prints it, and the driver cancels the job and names it."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    slurm.hold_sbatch(True)
    root = tmp_path / "study"
    driver = _stopped_driver(root, "driven", start_new_session=True)
    _until(lambda: slurm.held() or driver.poll() is not None, "sbatch was not called")
    os.killpg(driver.pid, signal.SIGINT)
    slurm.release_sbatch()
    output = _ended(driver, root)
    assert f"jobs: cancelled: a (slurm job {first})" in output and slurm.cancelled() == [str(first)], output


def _drive(runner, steps):
    """``runner.run(steps)`` in a thread: its records or its error land in the lists returned."""
    import threading

    records, errors = [], []

    def drive():
        try:
            records.append(runner.run(steps))
        except Exception as err:  # noqa: BLE001 - the test reports it
            errors.append(err)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    return driver, records, errors


def _sacct_answered(slurm):
    """Once sacct has been called twice more: it has answered the states set before."""
    calls = len(slurm.calls("sacct"))
    _until(lambda: len(slurm.calls("sacct")) >= calls + 2, "sacct was not asked")


def test_an_accounting_outage_after_sacct_knew_a_job_is_read_through_squeue(tmp_path, monkeypatch, caplog):
    """sacct answers RUNNING, then fails while the job's node fails (no result; squeue no longer lists it): the
    driver asks squeue, counts the job as ended after unknown_seconds and resubmits the step; it says once that
    sacct does not answer."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    root = tmp_path / "study"
    cluster = ClusterConfig(LauncherSettings(poll_seconds=0.1, unknown_seconds=0.5))
    driver, records, errors = _drive(Runner(root, launcher=JobLauncher(root, "slurm", cluster)), [_plan()[0]])
    _until(lambda: slurm.jobs(), "the step was not submitted")
    slurm.set_states(**{str(first): "RUNNING"})
    _sacct_answered(slurm)
    slurm.accounting(False)
    slurm.set_states(**{str(first): "NODE_FAIL"})
    _until(lambda: len(slurm.jobs()) == 2 or errors, "the step was not resubmitted", 30)
    record = {"result": {"text": "1"}, "wall_seconds": 1.0}
    _result(root / "jobs" / "a", str(first + 1), record)
    driver.join(30)
    assert records == [{"a": record}] and not errors, errors
    warnings = [r.getMessage() for r in caplog.records if "sacct does not answer" in r.getMessage()]
    assert warnings == ["sacct does not answer (sacct: error: Slurm accounting storage is disabled); the jobs are "
                        "looked up in squeue until it does"]


def test_a_job_is_never_counted_as_ended_while_neither_sacct_nor_squeue_answers(tmp_path, monkeypatch):
    """sacct and squeue both failing for many times unknown_seconds: the step's job is waited on, no second job
    is submitted into its folder; once they answer, the job's end is read as usual."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    slurm.accounting(False)
    slurm.queue(False)
    root = tmp_path / "study"
    cluster = ClusterConfig(LauncherSettings(poll_seconds=0.05, unknown_seconds=0.2))
    driver, records, errors = _drive(Runner(root, launcher=JobLauncher(root, "slurm", cluster)), [_plan()[0]])
    _until(lambda: (calls := slurm.calls("squeue")) and calls[-1] - calls[0] > 5 * 0.2 or errors,
           "squeue was not asked for long")
    assert list(slurm.jobs()) == [str(first)] and driver.is_alive(), errors
    slurm.queue(True)
    slurm.accounting(True)
    record = {"result": {"text": "1"}, "wall_seconds": 1.0}
    _result(root / "jobs" / "a", str(first), record)
    slurm.set_states(**{str(first): "COMPLETED"})
    driver.join(30)
    assert records == [{"a": record}] and list(slurm.jobs()) == [str(first)], errors


@pytest.mark.parametrize("settings", ["other", "same"])
def test_a_marker_of_a_job_slurm_never_knew_neither_blocks_the_step_nor_uses_a_retry(tmp_path, monkeypatch,
                                                                                     settings):
    """A step's marker names job 999999, which sacct and squeue never knew: with other settings the step is
    not refused (scancel could not cancel such a job); with the same, it is waited on for unknown_seconds and
    then submitted without using up a retry, so that a preemption afterwards is still resubmitted
    (max_retries = 1)."""
    from nat_kd.engine.runner import step_fingerprint

    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    root = tmp_path / "study"
    step = _plan()[0]
    marker = root / "jobs" / "a" / "submitted.json"
    marker.parent.mkdir(parents=True)
    Submitted("slurm", "999999", str(marker.parent),
              step_fingerprint(step, {}) if settings == "same" else "other settings").write(marker)
    cluster = ClusterConfig(LauncherSettings(poll_seconds=0.05, unknown_seconds=0.3, max_retries=1))
    driver, records, errors = _drive(Runner(root, launcher=JobLauncher(root, "slurm", cluster)), [step])
    _until(lambda: slurm.jobs() or errors, "the step was not submitted")
    assert not errors, errors
    slurm.set_states(**{str(first): "PREEMPTED"})
    _until(lambda: len(slurm.jobs()) == 2 or errors, "the preempted step was not resubmitted")
    record = {"result": {"text": "1"}, "wall_seconds": 1.0}
    _result(root / "jobs" / "a", str(first + 1), record)
    slurm.set_states(**{str(first + 1): "COMPLETED"})
    driver.join(30)
    assert records == [{"a": record}] and not errors, errors


def test_a_queued_job_whose_id_was_lost_is_found_by_its_name(tmp_path, monkeypatch):
    """The step's job is in Slurm's queue but its marker is gone (the driver was killed between sbatch and the
    marker): the rerun finds the job by its name, unique to the run and the step, and waits for it instead of
    submitting another."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    root = tmp_path / "study"
    script = tmp_path / "a.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --job-name={job_name('a', root)}\n")
    subprocess.run(["sbatch", str(script)], check=True, capture_output=True)
    driver, records, errors = _drive(Runner(root, launcher=JobLauncher(root, "slurm", FAST)), [_plan()[0]])
    marker = root / "jobs" / "a" / "submitted.json"
    _until(lambda: marker.exists() or errors, "the step's job was neither found nor submitted")
    assert Submitted.read(marker).job_id == str(first) and list(slurm.jobs()) == [str(first)], errors
    record = {"result": {"text": "1"}, "wall_seconds": 1.0}
    _result(root / "jobs" / "a", str(first), record)
    slurm.set_states(**{str(first): "COMPLETED"})
    driver.join(30)
    assert records == [{"a": record}] and list(slurm.jobs()) == [str(first)], errors


@pytest.mark.slow
def test_a_step_out_of_time_after_submitits_requeues_is_resubmitted(tmp_path, monkeypatch):
    """Slurm's time limit as submitit meets it: SIGUSR2 to the job's step, submitit requeues the job (scontrol
    requeue, the same id) up to 3 times, and at the fourth it saves "timed-out too many times" as the job's
    error. That is a time limit, not the step's own error: the step is resubmitted (max_retries) and runs."""
    from functools import partial

    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first, run=True)
    root = tmp_path / "study"
    step = Step("slow", "test", {}, partial(_wait_for_file, deps=[], value="s", flag=str(root / "go")))
    # a one-minute limit: every USR2 comes after the time submitit guarantees, so each counts as a time-out
    cluster = ClusterConfig(LauncherSettings(poll_seconds=0.2), {"test": {"hours": 0.01}})
    driver, records, errors = _drive(Runner(root, launcher=JobLauncher(root, "slurm", cluster)), [step])

    def starts():
        return len((root / "starts.txt").read_text().split()) if (root / "starts.txt").exists() else 0

    for run in range(1, 5):
        _until(lambda: starts() == run or errors, f"run {run} of the job did not start", 120)
        slurm.time_limit(str(first))
    _until(lambda: len(slurm.jobs()) == 2 or errors or not driver.is_alive(), "the step was not resubmitted", 120)
    (root / "go").touch()
    driver.join(120)
    assert not errors, errors
    assert records[0]["slow"]["launcher"]["jobs"] == [{"job_id": str(first), "state": "TIMEOUT"},
                                                      {"job_id": str(first + 1), "state": "COMPLETED"}]
    assert starts() == 5


def test_a_shard_job_no_marker_names_is_never_decoded_beside(tmp_path, monkeypatch):
    """The set's array is in Slurm's queue but its markers are gone: the generator cannot tell which shard each
    job decodes, so it submits nothing and names the jobs, instead of a second array into the same folder."""
    import threading

    from nat_kd.distill.cluster import ShardLauncher
    from nat_kd.distill.config import DistillConfig

    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    monkeypatch.setattr(ShardLauncher, "_check", lambda self: False)  # no teacher to load: the jobs are stand-ins
    out = tmp_path / "out"
    script = tmp_path / "array.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --array=0-1\n#SBATCH --job-name={job_name('distil.out', out)}\n")
    subprocess.run(["sbatch", str(script)], check=True, capture_output=True)
    cfg = DistillConfig(teachers=[str(tmp_path / "t.pt")], out_dir=str(out), num_shards=2)
    launcher = ShardLauncher(cfg, "slurm", ClusterConfig(LauncherSettings(poll_seconds=0.1)))
    errors = []

    def drive():
        try:
            launcher.run()
        except LaunchError as err:
            errors.append(err)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    _until(lambda: errors or len(slurm.jobs()) > 1, "the generator neither refused nor submitted")
    assert list(slurm.jobs()) == [str(first)] and len(errors) == 1
    assert str(errors[0]) == (f"{out}: slurm job(s) {first}, named {job_name('distil.out', out)}, are in the queue but "
                              f"no marker in {tmp_path / 'out.jobs'} names them (an earlier run lost their ids): wait "
                              f"for them to end or cancel them (scancel {first}), then run again")


def test_a_job_sbatch_queued_without_saying_so_is_cancelled_not_left_behind(tmp_path, monkeypatch):
    """sbatch fails after it has queued the job (its reply timed out): the step fails with sbatch's message, and
    the job found by its name is cancelled, since it would never get its work (submitit hands a job its pickled
    call only once sbatch has printed the id), so no rerun meets it."""
    first = _first_id()
    slurm = SlurmStandIn(tmp_path / "slurm", monkeypatch, first)
    slurm.lose_replies(True)
    root = tmp_path / "study"
    with pytest.raises(StepError) as err:
        Runner(root, launcher=JobLauncher(root, "slurm", FAST)).run([_plan()[0]])
    assert str(err.value) == ("step a failed: the job could not be submitted: sbatch: error: Batch job submission "
                              f"failed: Socket timed out on send/recv operation (sbatch queued slurm job(s) {first} "
                              "without saying so: cancelled, as they would never get their work)")
    assert slurm.cancelled() == [str(first)]
