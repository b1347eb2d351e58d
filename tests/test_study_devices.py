"""python -m nat_kd.study --device: where a local study's jobs run, shown with a fake GPU count (the suite sees
no GPU: conftest.py), and that a step trained on a GPU restores a fresh folder on the CPU like any other."""
import json
import re
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch

from nat_kd.engine.devices import Devices, visible_devices
from nat_kd.engine.runner import Runner, Step
from nat_kd.engine.store import Kept
from nat_kd.errors import SettingsError


def _meeting(count: int, seen: dict):
    """Steps that each wait until ``count`` of them run at once (or time out), noting their device."""
    barrier = threading.Barrier(count, timeout=20)

    def run(ctx):
        seen[ctx.step.name] = ctx.device
        barrier.wait()
        return {"outputs": []}

    return [Step(f"s{i}", "t", {"i": i}, run) for i in range(count)]


def test_jobs_on_one_gpu_run_side_by_side_and_each_record_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    seen = {}
    records = Runner(tmp_path, jobs=3, devices=Devices("cuda")).run(_meeting(3, seen))
    assert seen == {"s0": "cuda:0", "s1": "cuda:0", "s2": "cuda:0"}
    assert {n: r["device"] for n, r in records.items()} == seen
    assert json.loads((tmp_path / "steps" / "s1.json").read_text())["device"] == "cuda:0"


def test_jobs_spread_over_the_gpus_each_to_the_one_running_the_fewest(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    seen = {}
    Runner(tmp_path, jobs=4, devices=Devices("cuda")).run(_meeting(4, seen))
    assert Counter(seen.values()) == {"cuda:0": 2, "cuda:1": 2}
    devices = Devices("cuda")
    with devices.lease() as first, devices.lease() as second:
        with devices.lease() as third:
            assert (first, second, third) == ("cuda:0", "cuda:1", "cuda:0")
        with devices.lease() as fourth:  # the third's GPU is free again
            assert fourth == "cuda:0"
    # the Nth GPU the driver sees is the Nth that its own CUDA_VISIBLE_DEVICES names
    assert [visible_devices(d) for d in ("cuda:1", "cpu", None)] == ["1", None, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_devices("cuda:1") == "5"


def test_cpu_and_auto_without_a_gpu_run_on_the_cpu_and_cuda_without_one_is_refused_in_one_line(tmp_path):
    seen = {}
    records = Runner(tmp_path, jobs=2).run(_meeting(2, seen))  # auto: the suite sees no GPU
    assert set(seen.values()) == {"cpu"} and {r["device"] for r in records.values()} == {"cpu"}
    assert Devices("cpu").kind == "cpu"
    with pytest.raises(SettingsError, match=rf"^--device cuda: torch {re.escape(torch.__version__)} sees no GPU "
                                            r"\(CUDA_VISIBLE_DEVICES=''\): run where one is, or use --device cpu$"):
        Devices("cuda")


def test_a_job_is_told_its_device_on_its_command_line_and_its_gpu_in_its_environment(tmp_path):
    from nat_kd.engine.fairseq_jobs import device_flags, run_logged

    assert device_flags("fairseq_cli.train", "cpu") == ["--cpu"] and device_flags("fairseq_cli.train", "cuda:1") == []
    assert device_flags("fairseq_cli.generate", "cpu") == ["--cpu"] and device_flags("fairseq_cli.generate", None) == []
    assert [device_flags("nat_kd.generate_distilled", d) for d in ("cpu", "cuda:1", None)] == [
        ["--device", "cpu"], ["--device", "cuda"], []]
    seen = {}
    for device in ("cuda:1", "cpu"):
        log, out = tmp_path / f"{device}.log", tmp_path / f"{device}.json"
        run_logged("job_environment", ["--x", 1], log, threads=1, stdout=out, device=device,
                   cwd=Path(__file__).parent)
        seen[device] = json.loads(out.read_text()), log.read_text().splitlines()[:2]
    assert seen["cuda:1"] == ({"CUDA_VISIBLE_DEVICES": "1", "args": ["--x", "1"]},
                              ["# cuda:1: CUDA_VISIBLE_DEVICES=1", "$ python -m job_environment --x 1"])
    # on the CPU: the job's environment as the job server's (the suite's, which hides every GPU), and --cpu
    assert seen["cpu"][0] == {"CUDA_VISIBLE_DEVICES": "", "args": ["--x", "1", "--cpu"]}
    assert seen["cpu"][1][0] == "$ python -m job_environment --x 1 --cpu"


def _plan(calls):
    """A teacher (its checkpoint never kept), its set (kept) and a student (its hypotheses kept)."""
    def teacher(ctx):
        calls.append(("teacher", ctx.device))
        (ctx.work / "model.pt").write_text("weights")
        (ctx.work / "test.hyp").write_text("teacher hypotheses")
        return {"outputs": [str(ctx.work / "model.pt")], "checkpoint": str(ctx.work / "model.pt")}

    def distil(ctx):
        calls.append(("set", ctx.device))
        (ctx.work / "target.txt").write_text(Path(ctx.results["teacher"]["checkpoint"]).read_text() + " beam")
        return {"outputs": [str(ctx.work / "target.txt")], "dir": str(ctx.work)}

    def student(ctx):
        calls.append(("student", ctx.device))
        (ctx.work / "test.hyp").write_text("hypotheses of " + (Path(ctx.results["set"]["dir"]) / "target.txt").read_text())
        return {"outputs": [str(ctx.work / "test.hyp")], "test_hypotheses": str(ctx.work / "test.hyp")}

    return [Step("teacher", "train", {"updates": 10}, teacher,
                 keep=lambda work, result: Kept([Path("test.hyp")])),
            Step("set", "distil", {"beam": 5}, distil, ["teacher"], keep=lambda work, result: Kept([Path("target.txt")])),
            Step("student", "train", {"updates": 20}, student, ["set"],
                 keep=lambda work, result: Kept([Path("test.hyp")]))]


def test_steps_trained_on_a_gpu_restore_a_fresh_folder_on_the_cpu(tmp_path, monkeypatch):
    """The device is no input of a step: the records a GPU call brings back (the store's files) stand in for
    its steps in a study folder made afresh on the CPU, and still say where they ran."""
    calls, store = [], tmp_path / "store"
    with monkeypatch.context() as gpu:
        gpu.setattr(torch.cuda, "device_count", lambda: 1)
        Runner(tmp_path / "on-gpu", jobs=2, store=store, devices=Devices("cuda")).run(_plan(calls))
    assert calls == [("teacher", "cuda:0"), ("set", "cuda:0"), ("student", "cuda:0")]
    stored = {p.stem: json.loads(p.read_text()) for p in (store / "steps").glob("*.json")}
    assert {n: r["device"] for n, r in stored.items()} == dict.fromkeys(("teacher", "set", "student"), "cuda:0")
    committed = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}

    shutil.rmtree(tmp_path / "on-gpu")  # the GPU machine is gone; its store files were committed
    calls.clear()
    runner = Runner(tmp_path / "study", store=store, devices=Devices("cpu"))
    records = runner.run(_plan(calls))
    assert calls == [] and sorted(runner.skipped) == ["set", "student", "teacher"]
    assert (tmp_path / "study" / "work" / "student" / "test.hyp").read_text() == "hypotheses of weights beam"
    assert {n: r["device"] for n, r in records.items()} == dict.fromkeys(("teacher", "set", "student"), "cuda:0")
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == committed  # the store left as it was
    calls.clear()  # a new student on the restored set trains on the CPU, beside the GPU's records
    plan = _plan(calls)
    plan[2].settings = {"updates": 30}
    assert Runner(tmp_path / "study", store=store, devices=Devices("cpu")).run(plan)["student"]["device"] == "cpu"
    assert calls == [("student", "cpu")]


def test_the_command_line_refuses_cuda_without_a_gpu_and_a_device_with_a_launcher(tmp_path, capsys):
    from nat_kd.study.__main__ import main

    out = str(tmp_path / "study")
    assert main(["micro", "--out", out, "--device", "cuda", "--list"]) == 2
    assert "--device cuda: torch" in capsys.readouterr().err
    assert main(["micro", "--out", out, "--device", "cpu", "--launcher", "submitit-local", "--list"]) == 2
    assert "--device cpu is for the local launcher" in capsys.readouterr().err
    assert main(["micro", "--out", out, "--device", "cpu", "--list"]) == 0 and not (tmp_path / "study").exists()
