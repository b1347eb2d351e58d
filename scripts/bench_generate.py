"""Benchmark nat_kd.generate_distilled against plain fairseq-generate (beam search, CPU).

    nice python scripts/bench_generate.py --teacher-path runs/multi30k.en-de/teacher_tiny/checkpoint_best.pt \
        --prepared data/multi30k.en-de.spm8000 --split train --beam 5 --repeats 2

Both decoders run end to end as separate processes (start-up, model loading, decoding, writing: what a user
waits for), alternating, ``--repeats`` times each, with the same checkpoint, beam, length penalty, maximum
length and --max-tokens; fairseq-generate gets --required-batch-size-multiple 1 so that it translates every
sentence. Prints sentences/s of each, the ratio, whether the hypotheses are identical (token for token), the
machine's load, and how many sentences fairseq-generate returns with its default batch-size multiple.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from nat_kd.artifacts import DistilledSet, PreparedCorpus  # noqa: E402


def run(cmd: list[str], log: Path) -> float:
    start = time.perf_counter()
    with open(log, "w") as handle:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    return seconds


def hypotheses(generate_log: Path) -> dict[int, str]:
    """id -> hypothesis pieces from fairseq-generate's H- lines (no --remove-bpe: the raw pieces)."""
    out = {}
    for line in generate_log.read_text(encoding="utf-8").splitlines():
        match = re.match(r"H-(\d+)\t[^\t]*\t(.*)$", line)
        if match:
            out[int(match.group(1))] = match.group(2)
    return out


def subset(prepared: PreparedCorpus, split: str, limit: int, work: Path, src: str, tgt: str) -> Path:
    """The first ``limit`` sentences of a split, binarized with the prepared dictionary (quick runs)."""
    for lang in (src, tgt):
        lines = prepared.pieces(split, lang).read_text(encoding="utf-8").splitlines()[:limit]
        (work / f"sub.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    run([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", str(work / "sub"), "--destdir", str(work / "bin"),
         "--srcdict", str(prepared.bin.dictionary(src)), "--tgtdict", str(prepared.bin.dictionary(tgt)),
         "--workers", "2"], work / "preprocess.log")
    return work / "bin"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher-path", "--teacher", dest="teacher", required=True, help="teacher checkpoint")
    p.add_argument("--prepared", required=True, help="nat_kd.prepare output folder")
    p.add_argument("--split", default="train")
    p.add_argument("--limit", type=int, default=None, help="only the first N sentences (quick check)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=12000,
                   help="both decoders' (default: fairseq-generate's own default, and ours)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=0, help="our decoding processes (0: one per core)")
    p.add_argument("--skip-default-count", action="store_true")
    args = p.parse_args()

    prepared = PreparedCorpus(args.prepared)
    src, tgt = prepared.language_pair()
    work = Path(tempfile.mkdtemp(prefix="bench_generate."))
    split, data = args.split, prepared.bin.root
    if args.limit:
        data, split = subset(prepared, args.split, args.limit, work, src, tgt), "train"
    common = ["--beam", str(args.beam), "--lenpen", str(args.lenpen), "--max-len-a", "0",
              "--max-len-b", str(args.max_len_b), "--max-tokens", str(args.max_tokens)]
    fairseq = [sys.executable, "-m", "fairseq_cli.generate", str(data), "--user-dir", "fairseq_plugins",
               "--task", "translation", "--gen-subset", split, "--path", args.teacher, "--nbest", "1",
               "--source-lang", src, "--target-lang", tgt, *common]
    ours = [sys.executable, "-m", "nat_kd.generate_distilled", "--teacher-path", args.teacher, "--data", str(data),
            "--split", split, "--spm-model", str(prepared.spm_model), "--teacher-data", str(prepared.bin.root),
            "--strategy", "beam", "--workers", str(args.workers), "--no-progress-bar", *common]

    times = {"fairseq-generate": [], "nat_kd": []}
    for r in range(args.repeats):
        load = os.getloadavg()[0]
        times["fairseq-generate"].append(run(fairseq + ["--required-batch-size-multiple", "1"],
                                             work / f"fairseq.{r}.log"))
        out = work / f"ours.{r}"
        times["nat_kd"].append(run(ours + ["--out", str(out)], work / f"ours.{r}.log"))
        print(f"repeat {r}: fairseq-generate {times['fairseq-generate'][-1]:.1f} s, nat_kd {times['nat_kd'][-1]:.1f} s"
              f" (1-min load average before: {load:.2f})", flush=True)

    ref = hypotheses(work / "fairseq.0.log")
    ours_pieces = DistilledSet(work / "ours.0").pieces(split, tgt).read_text(encoding="utf-8").splitlines()
    n = len(ours_pieces)
    differing = [i for i in range(n) if ref.get(i) != ours_pieces[i]]
    same_across_repeats = all(DistilledSet(work / f"ours.{r}").text(split, tgt).read_bytes()
                              == DistilledSet(work / "ours.0").text(split, tgt).read_bytes() for r in range(args.repeats))
    best = {k: min(v) for k, v in times.items()}
    print(f"\nsentences: {n}; cores: {os.cpu_count()}; load average now: {os.getloadavg()}")
    for name, values in times.items():
        print(f"{name:17s} wall {', '.join(f'{v:.1f}' for v in values)} s -> best {n / best[name]:.1f} sent/s, "
              f"mean {n * len(values) / sum(values):.1f} sent/s")
    print(f"ratio nat_kd / fairseq-generate (sent/s): best {best['fairseq-generate'] / best['nat_kd']:.2f}x, "
          f"mean {sum(times['fairseq-generate']) / sum(times['nat_kd']):.2f}x")
    print(f"hypotheses identical to fairseq-generate: {n - len(differing)}/{n}"
          + (f" (differ at ids {differing[:10]})" if differing else "")
          + f"; fairseq-generate returned {len(ref)}; ours identical across repeats: {same_across_repeats}")
    meta = DistilledSet(work / "ours.0").meta()
    print(f"ours: {meta['sentences']} lines for {n} inputs; decode-only {meta['timing']['sentences_per_second']} "
          f"sent/s with {meta['timing']['workers']} worker(s)")
    translated = re.search(r"Translated ([\d,]+) sentences .* in ([\d.]+)s \(([\d.]+) sentences/s",
                           (work / "fairseq.0.log").read_text(encoding="utf-8"))
    if translated:
        print(f"fairseq-generate: decode-only {translated.group(3)} sent/s by its own timer "
              f"({translated.group(2)} s inside the generator)")
    if not args.skip_default_count:
        # fairseq-generate's own defaults for batching: no --max-tokens, --required-batch-size-multiple 8
        at = fairseq.index("--max-tokens")
        default = fairseq[:at] + fairseq[at + 2:]
        run(default, work / "fairseq.default.log")
        print(f"plain fairseq-generate (default batching: no --max-tokens, --required-batch-size-multiple 8) returned "
              f"{len(hypotheses(work / 'fairseq.default.log'))} of {n} sentences; nat_kd returned {meta['sentences']}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
