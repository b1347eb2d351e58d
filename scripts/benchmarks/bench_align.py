#!/usr/bin/env python
"""Benchmark the built-in aligner on Multi30k en-de train (sacrebleu 13a tokens, lowercased).

Default mode: times what ``fast_align -i corpus -d -o -v -p table > links`` does: read the ``src ||| tgt``
file, train 5 EM iterations, write the Pharaoh links and the pruned table. The corpus is also repeated 2x
and 4x to show how time grows. If a ``fast_align`` binary is on PATH it is timed on the same file too.

    python scripts/benchmarks/bench_align.py [--data-dir DIR] [--repeats 3] [--scales 1,2,4]

``--scale`` mode: a corpus of WMT14 en-de's size (4.5M pairs) built from Multi30k, each line two consecutive
sentence pairs joined (about 26 tokens a side), repeated to ``--lines``. For 1/8, 1/4, 1/2 and all of it,
times ``python -m nat_kd.analyze complexity -i FILE`` (-d -o -v, table only) and prints wall and CPU time,
peak resident memory and C(d). With ``systran-align`` importable (``pip install systran-align``: fast_align's
C++ core) it is timed against nat_kd on the first ``--peer-pairs`` pairs, single-threaded, alternating runs;
it trains both directions in one call.

    python scripts/benchmarks/bench_align.py --scale [--lines 4500000] [--fractions 8,4,2,1] [--peer-pairs 100000]

Every run is a fresh process, so its peak resident memory (ru_maxrss, interpreter and numpy included) is its
own; CPU time (user + system) suffers less than wall time when other jobs share the machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nat_kd.analysis.align import RECOMMENDED  # noqa: E402
from nat_kd.analysis.formats import format_alignments, format_parallel, format_table  # noqa: E402
from nat_kd.corpus import data_dir, read_lines, split_file  # noqa: E402


def worker(corpus: str, out_dir: str) -> None:
    """One timed run in this process; prints a JSON line."""
    from nat_kd.analysis.align import FastAlign
    from nat_kd.analysis.metrics import Complexity

    start, cpu_start = time.perf_counter(), time.process_time()
    result = FastAlign(RECOMMENDED).align_file(corpus)
    with open(Path(out_dir, "links"), "w", encoding="utf-8") as links:
        for shard in result.alignment_shards():
            links.write(format_alignments(shard))
    table = result.exported_table()
    Path(out_dir, "table").write_text(format_table(table))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb(), "pairs": result.num_sentences,
                      "table_entries": len(table.prob), "complexity": Complexity().table_score(table).score,
                      "tension": result.final_tension}))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def complexity_worker(corpus: str, out_dir: str) -> None:
    """``analyze complexity -i corpus`` (its defaults: -d -o -v, 13a tokens lowercased) in this process."""
    from nat_kd.analyze import main as analyze

    start, cpu_start = time.perf_counter(), time.process_time()
    summary = Path(out_dir, "complexity.json")
    if analyze(["complexity", "-i", corpus, "--json", str(summary)]) != 0:
        raise SystemExit("analyze complexity failed")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb(),
                      "complexity": json.loads(summary.read_text())["score"]}))


def systran_worker(corpus: str, out_dir: str) -> None:
    """systran-align's training (forward and backward models) with the same -d -o -v settings."""
    import systran_align

    start, cpu_start = time.perf_counter(), time.process_time()
    systran_align.generate_alignment_probabilities(corpus, str(Path(out_dir, "forward")), str(Path(out_dir, "backward")),
                                                   favor_diagonal=True, optimize_tension=True, variational_bayes=True)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb()}))


WORKERS = {"align": worker, "complexity": complexity_worker, "systran": systran_worker}


def run_worker(corpus: Path, out_dir: Path, kind: str = "align", env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", str(corpus), "--kind", kind, "--out", str(out_dir)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"{kind} worker failed on {corpus}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def tokenised_train(data: str | None) -> tuple[list[str], list[str], str]:
    from nat_kd.analysis.tokenizers import get_tokenizer

    directory = data_dir(data)
    tok = get_tokenizer("13a", lowercase=True)
    src = tok.corpus(read_lines(split_file(directory, "train", "en")))
    tgt = tok.corpus(read_lines(split_file(directory, "train", "de")))
    return src, tgt, f"{directory} train en-de, tokeniser {tok.signature}"


def scale_mode(args) -> None:
    """WMT14-sized corpus from Multi30k; analyze complexity (and systran-align) on growing prefixes of it."""
    src, tgt, what = tokenised_train(args.data_dir)
    joined = [f"{src[k]} {src[k + 1]} ||| {tgt[k]} {tgt[k + 1]}\n" for k in range(len(src) - 1)]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="nat_kd_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    fractions = [int(f) for f in args.fractions.split(",")]
    files = {f: work / f"scale.1of{f}.en-de" for f in fractions}
    handles = {f: open(path, "w", encoding="utf-8") for f, path in files.items()}
    lengths = [(left.count(" ") + 1, right.count(" ") + 1) for left, right in (j.split(" ||| ") for j in joined)]
    src_tokens = tgt_tokens = links = 0
    for number in range(args.lines):
        line = joined[number % len(joined)]
        for f, handle in handles.items():
            if number < args.lines // f:
                handle.write(line)
        n, m = lengths[number % len(joined)]
        src_tokens, tgt_tokens, links = src_tokens + n, tgt_tokens + m, links + n * m
    for handle in handles.values():
        handle.close()
    print(f"corpus: {what}; consecutive pairs joined ({len(joined)} lines), repeated to {args.lines} lines in {work}")
    print(f"mean tokens per line: source {src_tokens / args.lines:.1f}, target {tgt_tokens / args.lines:.1f}; "
          f"links (target token x source position): {links / 1e9:.2f} billion in all")
    print(f"cpus: {os.cpu_count()}; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| pairs | wall s | CPU s | peak RSS MB | C(d) nats | CPU s per M pairs |")
    print("|---|---|---|---|---|---|")
    for f in sorted(fractions, reverse=True):
        pairs = args.lines // f
        ours = run_worker(files[f], work, "complexity")
        print(f"| {pairs} | {ours['wall_s']:.0f} | {ours['cpu_s']:.0f} | {ours['peak_mb']:.0f} | "
              f"{ours['complexity']:.4f} | {ours['cpu_s'] / pairs * 1e6:.1f} |", flush=True)
    if importlib.util.find_spec("systran_align") is None:
        print("systran-align is not installed (pip install systran-align): only the built-in aligner was timed")
    elif args.peer_pairs:
        # the C++ peer trains both directions in one call, so it is timed on a slice, alternating with ours
        peer_file = work / f"scale.first{args.peer_pairs}.en-de"
        with open(files[min(fractions)], encoding="utf-8") as whole, open(peer_file, "w", encoding="utf-8") as out:
            out.writelines(itertools.islice(whole, args.peer_pairs))
        print(f"\nfirst {args.peer_pairs} pairs, alternating: nat_kd (one direction, -d -o -v) against systran-align "
              "(fast_align's C++ core, forward and backward models, OMP_NUM_THREADS=1)")
        print("| run | nat_kd wall s | CPU s | peak RSS MB | systran-align wall s | CPU s | peak RSS MB |")
        print("|---|---|---|---|---|---|---|")
        for repeat in range(args.repeats):
            ours = run_worker(peer_file, work, "complexity")
            theirs = run_worker(peer_file, work, "systran", {"OMP_NUM_THREADS": "1"})
            print(f"| {repeat + 1} | {ours['wall_s']:.1f} | {ours['cpu_s']:.1f} | {ours['peak_mb']:.0f} | "
                  f"{theirs['wall_s']:.1f} | {theirs['cpu_s']:.1f} | {theirs['peak_mb']:.0f} |", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.work_dir:
        shutil.rmtree(work)


def run_binary(corpus: Path, out_dir: Path) -> dict:
    start = time.perf_counter()
    with open(out_dir / "fa_links", "w") as links:
        subprocess.run(["fast_align", "-i", str(corpus), "-d", "-o", "-v", "-p", str(out_dir / "fa_table")],
                       stdout=links, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--repeats", type=int, default=3, help="runs per scale; the fastest and median are shown")
    parser.add_argument("--scales", default="1,2,4", help="corpus repetitions to time")
    parser.add_argument("--scale", action="store_true", help="WMT14-sized corpus mode (see above)")
    parser.add_argument("--lines", type=int, default=4_500_000, help="--scale: pairs in the whole corpus")
    parser.add_argument("--fractions", default="8,4,2,1", help="--scale: time 1/F of the corpus for each F")
    parser.add_argument("--work-dir", help="--scale: keep the corpus files here (default: a temporary folder)")
    parser.add_argument("--peer-pairs", type=int, default=100_000,
                        help="--scale: time systran-align against nat_kd on this many pairs (0: not at all)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="align", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        WORKERS[args.kind](args.worker, args.out)
        return
    if args.scale:
        scale_mode(args)
        return

    start = time.perf_counter()
    src, tgt, what = tokenised_train(args.data_dir)
    tokenise_s = time.perf_counter() - start
    print(f"corpus: {what}, {len(src)} pairs ({tokenise_s:.2f} s to tokenise, not included below)")
    print(f"aligner: builtin {RECOMMENDED.signature()}; cpus: {os.cpu_count()}; "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    text = format_parallel(src, tgt)
    print("| scale | pairs | wall s (min) | wall s (median) | CPU s (min) | peak MB | C(d) nats | tension |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="nat_kd_bench_") as tmp:
        tmp = Path(tmp)
        for scale in (int(s) for s in args.scales.split(",")):
            corpus = tmp / f"corpus.x{scale}"
            corpus.write_text(text * scale, encoding="utf-8")
            runs = [run_worker(corpus, tmp) for _ in range(args.repeats)]
            walls = sorted(r["wall_s"] for r in runs)
            last = runs[-1]
            print(f"| {scale}x | {last['pairs']} | {walls[0]:.2f} | {walls[len(walls) // 2]:.2f} | "
                  f"{min(r['cpu_s'] for r in runs):.2f} | {max(r['peak_mb'] for r in runs):.0f} | {last['complexity']:.4f} | {last['tension']:.3f} |",
                  flush=True)
            if shutil.which("fast_align"):
                fa = run_binary(corpus, tmp)
                print(f"|   fast_align binary | {last['pairs']} | {fa['wall_s']:.2f} | | | | | |", flush=True)
    if not shutil.which("fast_align"):
        print("no fast_align binary on PATH: only the built-in aligner was timed")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
