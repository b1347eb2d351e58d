"""Is this checkout's generator no slower than an earlier commit's? Both decode the same sentences with the
same teacher, backend by backend, alternating old and new in each round (a shared machine's load then weighs
on both sides alike).

    nice python scripts/benchmarks/bench_against_commit.py --base 78f0845 --teacher-path T.pt --prepared DATA \
        --split train --lines 3000 --beam 5 --repeats 3 --backends fairseq ctranslate2

The base commit is exported (git archive) into a temporary folder and run from there with this environment.
Each run is a separate process, end to end (start-up, loading, decoding, writing); it prints, per backend,
each run's wall seconds and decoding sentences/s (meta.json's timing), the median new/old ratio of both, and
whether the two commits wrote the same target text.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout import unpack  # scripts/benchmarks/checkout.py, beside this script

ROOT = Path(__file__).resolve().parents[2]


def distil(checkout: Path, args, backend: str, source: Path, reference: Path, out: Path) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "nat_kd.generate_distilled", "--teacher-path", args.teacher_path,
           "--source", str(source), "--reference", str(reference), "--spm-model", str(Path(args.prepared) / "spm.model"),
           "--teacher-data", str(Path(args.prepared) / "bin"), "--split", args.split, "--strategy", "beam",
           "--beam", str(args.beam), "--out", str(out), "--no-progress-bar", "--backend", backend,
           "--ct2-cache", str(out.parent / "ct2-cache")]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed in {checkout}: {' '.join(cmd)}\n{proc.stdout[-3000:]}")
    return wall, json.loads((out / "meta.json").read_text())["timing"]["sentences_per_second"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the commit to compare with")
    p.add_argument("--teacher-path", required=True)
    p.add_argument("--prepared", required=True, help="nat_kd.prepare folder (raw/, spm.model, bin/)")
    p.add_argument("--split", default="train")
    p.add_argument("--lines", type=int, default=2000, help="the split's first N lines")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backends", nargs="+", default=["fairseq", "ctranslate2"])
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-commit-") as tmp:
        tmp = Path(tmp)
        old = unpack(args.base, tmp / "base")
        config = json.loads((Path(args.prepared) / "manifest.json").read_text())["config"]
        src, tgt = config["src"], config["tgt"]
        texts = {}
        for lang in (src, tgt):
            lines = (Path(args.prepared) / "raw" / f"{args.split}.{lang}").read_text(encoding="utf-8").splitlines()
            texts[lang] = tmp / f"{args.split}.{lang}"
            texts[lang].write_text("".join(line + "\n" for line in lines[:args.lines]), encoding="utf-8")
        for backend in args.backends:
            results = {"old": [], "new": []}
            for round_ in range(args.repeats):
                order = [("old", old), ("new", ROOT)] if round_ % 2 == 0 else [("new", ROOT), ("old", old)]
                for side, checkout in order:
                    out = tmp / f"{backend}-{side}-{round_}"
                    results[side].append(distil(checkout, args, backend, texts[src], texts[tgt], out))
                    print(f"{backend} round {round_} {side}: {results[side][-1][0]:.1f} s wall, "
                          f"{results[side][-1][1]:.1f} sentences/s decoding", flush=True)
            same = all((tmp / f"{backend}-old-{r}" / f"{args.split}.{tgt}").read_bytes()
                       == (tmp / f"{backend}-new-{r}" / f"{args.split}.{tgt}").read_bytes() for r in range(args.repeats))
            wall = statistics.median(n[0] / o[0] for o, n in zip(results["old"], results["new"]))
            speed = statistics.median(n[1] / o[1] for o, n in zip(results["old"], results["new"]))
            print(f"{backend}: {args.lines} sentences, new/old wall time {wall:.3f} (median of {args.repeats}), "
                  f"new/old decoding speed {speed:.3f}; same target text: {same}")


if __name__ == "__main__":
    main()
