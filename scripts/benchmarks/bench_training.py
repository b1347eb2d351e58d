"""Training speed of every NAT student family and of fairseq's transformer, on any device, in steady state.

    python scripts/benchmarks/bench_training.py --data data/multi30k.en-de.spm8000/bin --out docs/results/gpu/training \
        [--models nat glat ctc glat_ctc dat transformer] [--shapes 2x128:4096 6x512:16384 6x512:65536] \
        [--precisions fp32 fp16 amp] [--warmup 30 --updates 100 --repeats 2] [--deadline SECONDS] \
        [--cpu --threads 1 2]

Each configuration (model, shape and batch, precision) trains in a process of its own with fairseq's own Trainer
and the study's own fairseq-train arguments (nat_kd.engine.fairseq_jobs.train_args), so the model, loss, batches
and optimiser are those a user trains. It runs ``--warmup`` updates, then times ``--updates`` more, waiting
for the device before reading each clock. The configurations run in a shuffled order (``--seed``), every one
``--repeats`` times, each round shuffled anew; with ``--deadline`` the rounds stop at the first configuration
that would start past it, and what finished is kept. Prints, and writes to OUT/results.json and OUT/table.md:
updates/s, target tokens/s, the updates that fp16's loss scaler skipped, and peak device memory.

Precisions: fp32; ``--fp16`` (fairseq's FP16Optimizer: fp16 weights, fp32 master copy, dynamic loss scale);
``--amp`` (torch autocast with fp32 weights). fairseq's ``--bf16`` implies ``--tpu`` (fairseq/options.py), so
it does not run on a GPU and is not offered. fp16 and amp need a GPU.

``--threads``: each count of CPU threads is a configuration of its own (OMP_NUM_THREADS, MKL_NUM_THREADS and
torch.set_num_threads in the child, as a study's job sets them); without it torch chooses.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODELS = ("nat", "glat", "ctc", "glat_ctc", "dat", "transformer")  # transformer: the AT anchor
NAMES = {"nat": "vanilla NAT", "glat": "GLAT", "ctc": "CTC", "glat_ctc": "CTC with glancing",
         "dat": "DA-Transformer", "transformer": "fairseq's transformer"}
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "amp": ["--amp"]}


def shape_of(spec: str):
    """'6x512:16384' -> (ModelSize.parse('6x512'), max tokens 16384)."""
    from fairseq_plugins.models.sizes import ModelSize

    try:
        dims, max_tokens = spec.split(":")
        return ModelSize.parse(dims), int(max_tokens)
    except ValueError:
        raise SystemExit(f"--shapes {spec}: write LAYERSxWIDTH:MAX_TOKENS, e.g. 6x512:16384") from None


def train_arguments(model: str, spec: str, precision: str, data: str, save_dir: str, cpu: bool = False) -> list[str]:
    """fairseq-train's arguments for one configuration, as the study builds them."""
    from nat_kd.engine.training import Training
    from nat_kd.engine.fairseq_jobs import train_args
    from nat_kd.engine.steps import student_arch

    shape, max_tokens = shape_of(spec)
    family = None if model == "transformer" else model
    training = Training(updates=10**9, max_tokens=max_tokens, warmup=200, validate_every=10**9,
                        glance_anneal_updates=1333)
    argv = train_args(Path(data), Path(save_dir), arch="kd_transformer_tiny" if family is None else student_arch(family),
                      shape=shape, training=training, nat_family=family)
    return [str(a) for a in argv] + PRECISION_FLAGS[precision] + (["--cpu"] if cpu else [])


def measure(model: str, spec: str, precision: str, data: str, warmup: int, updates: int, cpu: bool,
            threads: int | None) -> dict:
    """One configuration in this process: warm-up updates, then timed ones (run by the parent in a child)."""
    import logging

    logging.basicConfig(level=logging.WARNING)  # before fairseq: it would otherwise log every update
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    with tempfile.TemporaryDirectory() as save_dir:
        parser = options.get_training_parser()
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(
            parser, train_arguments(model, spec, precision, data, save_dir, cpu)))
        task = tasks.setup_task(cfg.task)
        task.load_dataset("train")
        trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
        cuda = trainer.cuda
        epoch = 1

        def batches():
            nonlocal epoch
            while True:  # epochs one after the other: a big batch on a small corpus is few batches an epoch
                yield from trainer.get_train_iterator(epoch=epoch).next_epoch_itr(shuffle=True)
                epoch += 1

        stream = batches()

        def sync():
            if cuda:
                torch.cuda.synchronize()

        for _ in range(warmup):
            trainer.train_step([next(stream)])
        sync()
        before = trainer.get_num_updates()
        tokens, start = 0, time.perf_counter()
        for _ in range(updates):
            sample = next(stream)
            tokens += int(sample["ntokens"])
            trainer.train_step([sample])
        sync()
        seconds = time.perf_counter() - start
        applied = trainer.get_num_updates() - before
    return {"model": model, "shape": spec, "precision": precision, "threads": torch.get_num_threads(),
            "device": device_name(not cuda),
            "parameters": sum(p.numel() for p in trainer.model.parameters()),
            "warmup": warmup, "updates": updates, "skipped_updates": updates - applied,
            "seconds": round(seconds, 4), "updates_per_second": round(updates / seconds, 3),
            "target_tokens_per_second": round(tokens / seconds, 1),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None}


def report_and_exit(figures: dict) -> None:
    """Print one configuration's figures and end the process without the interpreter's teardown.

    fairseq's batch iterator collates the next batches in a daemon thread (its BufferedIterator). When the
    timed loop ends, that thread is usually inside torch's C++ code, refilling the queue that fast updates
    drained; at teardown, CPython before 3.14 stops such a thread with pthread_exit, whose unwinding through
    a noexcept C++ frame calls std::terminate: "terminate called without an active exception", exit 134.
    """
    print(json.dumps(figures), flush=True)
    os._exit(0)


def device_name(cpu: bool) -> str:
    import torch

    return "cpu" if cpu or not torch.cuda.is_available() else torch.cuda.get_device_name()


def run_child(config: tuple[str, str, str, int | None], args) -> dict:
    """One configuration in a process of its own; an error (out of memory, say) is recorded, not raised."""
    model, spec, precision, threads = config
    cmd = [sys.executable, __file__, "--one", model, spec, precision, "--data", args.data,
           "--warmup", str(args.warmup), "--updates", str(args.updates), *(["--cpu"] if args.cpu else []),
           *(["--one-threads", str(threads)] if threads else [])]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}))
    started = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    wall = round(time.perf_counter() - started, 1)
    measured = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if measured:  # a process that failed after printing its figures still measured them
        extra = {} if proc.returncode == 0 else {"exit": proc.returncode, "stderr_tail": proc.stderr[-300:]}
        return {**json.loads(measured[-1]), "process_seconds": wall, **extra}
    error = (proc.stderr.strip().splitlines() or ["exit code %d" % proc.returncode])[-1]
    return {"model": model, "shape": spec, "precision": precision, "threads": threads, "error": error[:300],
            "exit": proc.returncode,
            "stderr_tail": proc.stderr[-2000:], "process_seconds": wall}


def table(results: list[dict]) -> str:
    """Markdown: one row a configuration, the median over its repeats, with the transformer's ratio at the same
    shape, precision and threads."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["shape"], r["precision"], r.get("threads") or 0, r["model"]), []).append(r)
    anchor = {}
    for (spec, precision, threads, model), runs in groups.items():
        ok = [r for r in runs if "error" not in r]
        if model == "transformer" and ok:
            anchor[spec, precision, threads] = statistics.median(r["target_tokens_per_second"] for r in ok)
    rows = ["| shape: max tokens | precision | threads | model | updates/s | target tokens/s | vs transformer | "
            "skipped | peak GiB | runs |", "|---|---|---|---|---|---|---|---|---|---|"]
    order = {m: i for i, m in enumerate(MODELS)}
    for key in sorted(groups, key=lambda k: (k[0], list(PRECISION_FLAGS).index(k[1]), k[2], order[k[3]])):
        spec, precision, threads, model = key
        runs = groups[key]
        ok = [r for r in runs if "error" not in r]
        shown = threads or "torch's"
        if not ok:
            rows.append(f"| {spec} | {precision} | {shown} | {NAMES[model]} | failed: {runs[0]['error'][:80]} "
                        f"| | | | | {len(runs)} |")
            continue
        ups = statistics.median(r["updates_per_second"] for r in ok)
        tps = statistics.median(r["target_tokens_per_second"] for r in ok)
        base = anchor.get((spec, precision, threads))
        ratio = f"{tps / base:.2f}" if base else ""
        peak = max((r["peak_memory_gib"] or 0) for r in ok) if ok[0]["peak_memory_gib"] is not None else None
        rows.append(f"| {spec} | {precision} | {shown} | {NAMES[model]} | {ups:.2f} | {tps:,.0f} | {ratio} | "
                    f"{max(r['skipped_updates'] for r in ok)} | {'' if peak is None else f'{peak:.2f}'} | "
                    f"{len(ok)} of {len(runs)} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a binarized folder (a prepared corpus's bin/)")
    p.add_argument("--out", help="folder for results.json and table.md")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--shapes", nargs="+", default=["2x128:4096", "6x512:16384", "6x512:65536"],
                   help="LAYERSxWIDTH:MAX_TOKENS, each one a model shape and its batch")
    p.add_argument("--precisions", nargs="+", default=list(PRECISION_FLAGS), choices=list(PRECISION_FLAGS))
    p.add_argument("--warmup", type=int, default=30, help="updates before the clock starts")
    p.add_argument("--updates", type=int, default=100, help="timed updates")
    p.add_argument("--repeats", type=int, default=2, help="rounds, each over every configuration, shuffled")
    p.add_argument("--seed", type=int, default=1, help="of the shuffles")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from the start after which no configuration starts")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even where there is a GPU")
    p.add_argument("--threads", nargs="+", type=int, default=None,
                   help="CPU thread counts, each a configuration (default: torch's own choice)")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "SHAPE", "PRECISION"), help=argparse.SUPPRESS)
    p.add_argument("--one-threads", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        report_and_exit(measure(*args.one, args.data, args.warmup, args.updates, args.cpu, args.one_threads))
    for spec in args.shapes:
        shape_of(spec)
    if args.threads and min(args.threads) < 1:
        p.error("--threads: each count must be at least 1")
    configs = [(m, s, pr, t) for s in args.shapes for pr in args.precisions for t in (args.threads or [None])
               for m in args.models]
    rng, started, results = random.Random(args.seed), time.perf_counter(), []
    out = Path(args.out) if args.out else None
    stopped = False
    for round_ in range(args.repeats):
        order = configs[:]
        rng.shuffle(order)
        for config in order:
            if args.deadline is not None and time.perf_counter() - started > args.deadline:
                stopped = True
                break
            result = {**run_child(config, args), "round": round_}
            results.append(result)
            print(json.dumps(result), flush=True)
            if out:  # after every configuration: a run cut short keeps what it measured
                write(out, results, args, stopped=False)
        if stopped:
            print(f"deadline of {args.deadline:.0f} s reached: {len(results)} of {len(configs) * args.repeats} runs "
                  "done", flush=True)
            break
    print(table(results), end="")
    if out:
        write(out, results, args, stopped)


def write(out: Path, results: list[dict], args, stopped: bool) -> None:
    from nat_kd import atomic

    out.mkdir(parents=True, exist_ok=True)
    import torch

    meta = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "device": device_name(args.cpu),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cpu_cores": os.cpu_count(),
            "warmup": args.warmup, "updates": args.updates, "repeats": args.repeats, "seed": args.seed,
            "threads": args.threads,
            "stopped_at_deadline": stopped}
    atomic.write_json(out / "results.json", {"meta": meta, "runs": results})
    atomic.write_text(out / "table.md", table(results))


if __name__ == "__main__":
    main()
