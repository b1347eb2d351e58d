#!/usr/bin/env python
"""Benchmark the built-in aligner on Multi30k en-de train (sacrebleu 13a tokens, lowercased).

Times what ``fast_align -i corpus -d -o -v -p table > links`` does: read the ``src ||| tgt`` file, train
5 EM iterations, write the Pharaoh links and the pruned table. Each run is a fresh Python process so its
peak resident memory (ru_maxrss, interpreter and numpy included) is the run's own; CPU time
(user + system) is shown too, as it suffers less than wall time when other jobs share the machine. Tokenisation is timed
separately. The corpus is also repeated 2x and 4x to show how time grows.

    python scripts/bench_align.py [--data-dir DIR] [--repeats 3] [--scales 1,2,4]

If a ``fast_align`` binary is on PATH it is timed on the same file too.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nat_kd.align import RECOMMENDED  # noqa: E402
from nat_kd.alignment_io import format_alignments, format_parallel, format_table  # noqa: E402
from nat_kd.corpus import data_dir, read_lines, split_file  # noqa: E402


def worker(corpus: str, out_dir: str) -> None:
    """One timed run in this process; prints a JSON line."""
    from nat_kd.align import FastAlign
    from nat_kd.metrics import Complexity

    start, cpu_start = time.perf_counter(), time.process_time()
    result = FastAlign(RECOMMENDED).align_file(corpus)
    Path(out_dir, "links").write_text(format_alignments(result.alignments))
    table = result.exported_table()
    Path(out_dir, "table").write_text(format_table(table))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb, "pairs": result.alignments.num_sentences, "table_entries": len(table.prob),
                      "complexity": Complexity().table_score(table).score, "tension": result.final_tension}))


def run_worker(corpus: Path, out_dir: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", str(corpus), "--out", str(out_dir)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.out)
        return

    from nat_kd.tokenizers import get_tokenizer

    directory = data_dir(args.data_dir)
    tok = get_tokenizer("13a", lowercase=True)
    start = time.perf_counter()
    src = tok.corpus(read_lines(split_file(directory, "train", "en")))
    tgt = tok.corpus(read_lines(split_file(directory, "train", "de")))
    tokenise_s = time.perf_counter() - start
    print(f"corpus: {directory} train en-de, {len(src)} pairs; tokeniser {tok.signature} "
          f"({tokenise_s:.2f} s, not included below)")
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
