"""scripts/benchmarks/bench_training.py: its table's arithmetic, and a CPU smoke run that keeps it runnable."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts" / "benchmarks"))
import bench_training  # noqa: E402


def run(model, shape, precision, tokens_per_second, updates_per_second=1.0, skipped=0, peak=None, error=None):
    if error:
        return {"model": model, "shape": shape, "precision": precision, "error": error}
    return {"model": model, "shape": shape, "precision": precision, "updates_per_second": updates_per_second,
            "target_tokens_per_second": tokens_per_second, "skipped_updates": skipped, "peak_memory_gib": peak}


def test_table_takes_the_median_of_the_repeats_and_the_transformers_ratio_in_the_same_shape_and_precision():
    results = [run("transformer", "6x512:16384", "fp16", 40000.0, peak=1.0),
               run("transformer", "6x512:16384", "fp16", 44000.0, peak=1.5),
               run("dat", "6x512:16384", "fp16", 10000.0, skipped=1, peak=2.0),
               run("dat", "6x512:16384", "fp16", 14000.0, skipped=3, peak=2.5),
               run("dat", "6x512:16384", "fp16", 30000.0, skipped=0, peak=2.25),
               run("dat", "6x512:16384", "fp32", 9000.0, peak=3.0),  # no transformer in fp32: no ratio
               run("nat", "6x512:16384", "fp16", 0, error="torch.OutOfMemoryError: CUDA out of memory")]
    rows = {}
    for line in bench_training.table(results).splitlines()[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[2] == "torch's"  # no thread count asked for
        rows[cells[0], cells[1], cells[3]] = cells[4:]
    # transformer: median of 40k and 44k = 42k; DA-T: median of 10k, 14k, 30k = 14k; 14/42 = 0.33
    assert rows["6x512:16384", "fp16", "fairseq's transformer"][:3] == ["1.00", "42,000", "1.00"]
    assert rows["6x512:16384", "fp16", "DA-Transformer"] == ["1.00", "14,000", "0.33", "3", "2.50", "3 of 3"]
    assert rows["6x512:16384", "fp32", "DA-Transformer"][2] == ""
    assert rows["6x512:16384", "fp16", "vanilla NAT"][0].startswith("failed: torch.OutOfMemoryError")
    # rows follow the shape, then the precision, then the models' order
    order = [key for key in rows]
    assert order.index(("6x512:16384", "fp32", "DA-Transformer")) < order.index(("6x512:16384", "fp16", "vanilla NAT"))
    assert order.index(("6x512:16384", "fp16", "vanilla NAT")) < order.index(("6x512:16384", "fp16", "DA-Transformer"))


def test_each_thread_count_is_a_configuration_of_its_own_with_its_own_transformer_ratio(monkeypatch):
    results = [{**run("transformer", "3x256:4096", "fp32", 1000.0), "threads": 1},
               {**run("transformer", "3x256:4096", "fp32", 1600.0), "threads": 2},
               {**run("nat", "3x256:4096", "fp32", 500.0), "threads": 1},
               {**run("nat", "3x256:4096", "fp32", 1200.0), "threads": 2}]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in bench_training.table(results).splitlines()[2:]]
    # thread counts in order, then the models' order; each ratio against the transformer at the same count
    assert [(r[2], r[3], r[5], r[6]) for r in rows] == [
        ("1", "vanilla NAT", "500", "0.50"), ("1", "fairseq's transformer", "1,000", "1.00"),
        ("2", "vanilla NAT", "1,200", "0.75"), ("2", "fairseq's transformer", "1,600", "1.00")]
    calls = []
    monkeypatch.setattr(bench_training.subprocess, "run", lambda cmd, **k: calls.append((cmd, k["env"])) or
                        subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(results[1]) + "\n", stderr=""))
    args = type("Args", (), {"data": "bin", "warmup": 3, "updates": 5, "cpu": True})
    bench_training.run_child(("transformer", "3x256:4096", "fp32", 2), args)
    cmd, env = calls[0]
    assert cmd[cmd.index("--one-threads") + 1] == "2"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    bench_training.run_child(("transformer", "3x256:4096", "fp32", None), args)
    assert "--one-threads" not in calls[1][0]


def test_shapes_are_parsed_and_a_wrong_one_is_refused_with_the_form_to_write():
    shape, max_tokens = bench_training.shape_of("6x512:16384")
    assert (shape.layers, shape.embed_dim, shape.ffn_dim, shape.heads, max_tokens) == (6, 512, 2048, 8, 16384)
    with pytest.raises(SystemExit, match="LAYERSxWIDTH:MAX_TOKENS"):
        bench_training.shape_of("6x512")


@pytest.mark.slow
def test_smoke_run_on_cpu_trains_each_kind_of_model_and_writes_its_results(tiny_en_de, tmp_path):
    """A micro model of three kinds (one-pass NAT, the DAG loss, the AT anchor), a few updates each, on the CPU
    (--cpu: on a GPU machine too)."""
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "benchmarks" / "bench_training.py"), "--data", str(tiny_en_de / "bin"),
         "--out", str(out), "--models", "nat", "dat", "transformer", "--shapes", "1x32:512",
         "--precisions", "fp32", "--warmup", "1", "--updates", "2", "--repeats", "1", "--cpu", "--threads", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    saved = json.loads((out / "results.json").read_text())
    runs = saved["runs"]
    assert sorted(r["model"] for r in runs) == ["dat", "nat", "transformer"]
    for r in runs:
        assert "error" not in r, r
        assert r["device"] == "cpu" and r["updates"] == 2 and r["skipped_updates"] == 0 and r["threads"] == 1
        assert r["updates_per_second"] == pytest.approx(2 / r["seconds"], rel=1e-2)
        assert r["target_tokens_per_second"] > r["updates_per_second"]  # every batch holds many target tokens
    assert saved["meta"]["device"] == "cpu" and saved["meta"]["stopped_at_deadline"] is False
    assert (out / "table.md").read_text() == bench_training.table(runs)


def test_a_child_that_crashes_after_printing_its_figures_keeps_them_and_one_that_printed_none_is_an_error(monkeypatch):
    figures = run("nat", "6x512:16384", "fp16", 30000.0)
    answers = iter([
        subprocess.CompletedProcess([], -6, stdout="loading\n" + json.dumps(figures) + "\n",
                                    stderr="terminate called without an active exception\n"),
        subprocess.CompletedProcess([], 1, stdout="loading\n", stderr="Traceback ...\ntorch.OutOfMemoryError: CUDA\n")])
    monkeypatch.setattr(bench_training.subprocess, "run", lambda *a, **k: next(answers))
    args = type("Args", (), {"data": "bin", "warmup": 30, "updates": 100, "cpu": False})
    kept = bench_training.run_child(("nat", "6x512:16384", "fp16", None), args)
    assert kept["target_tokens_per_second"] == 30000.0 and kept["exit"] == -6 and "error" not in kept
    failed = bench_training.run_child(("nat", "6x512:16384", "fp16", None), args)
    assert failed["error"] == "torch.OutOfMemoryError: CUDA" and failed["exit"] == 1


@pytest.mark.slow
def test_the_measuring_process_exits_cleanly_while_fairseqs_loader_thread_is_still_collating():
    """fairseq's BufferedIterator collates the next batches in a daemon thread; a process that ends while that
    thread is inside torch's C++ code is aborted at teardown by CPython before 3.14 (exit 134). Here the
    thread computes batches that take long in torch; the figures are printed and the exit status is 0."""
    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts' / 'benchmarks')!r})\n"
        "import bench_training\n"
        "from fairseq.data.iterators import BufferedIterator\n"
        "torch.set_num_threads(1)\n"
        "a = torch.randn(400, 400)\n"
        "class SlowBatches:\n"
        "    def __len__(self):\n"
        "        return 10**6\n"
        "    def __iter__(self):\n"
        "        while True:\n"
        "            yield torch.mm(torch.mm(a, a), a).sum()\n"
        "batches = BufferedIterator(1000, SlowBatches())\n"
        "next(batches)\n"
        "bench_training.report_and_exit({'model': 'nat', 'updates': 1})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, '{"model": "nat", "updates": 1}\n'), proc.stderr[-2000:]
