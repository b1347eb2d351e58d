"""Benchmark nat_kd.generate_distilled (fairseq backend, and with --backend ctranslate2 also the ctranslate2
backend) against plain fairseq-generate (beam search), on the CPU or a GPU.

    nice python scripts/benchmarks/bench_generate.py --teacher-path runs/multi30k.en-de/teacher_tiny/checkpoint_best.pt \
        --prepared data/multi30k.en-de.spm8000 --split train --beam 5 --repeats 2 \
        [--backend ctranslate2 --compute-type float32 int8] [--device cuda [--fp16]] [--limit N] \
        [--variant w4='--workers 4' --variant fp16=--fp16 --variant auto='--max-tokens auto' ...]

Every decoder runs end to end as a separate process (start-up, model loading, decoding, writing: what a user
waits for), one after the other in each of ``--repeats`` rounds, with the same checkpoint, beam, length
penalty and maximum length; fairseq-generate and the fairseq backend with the same --max-tokens, and
fairseq-generate with --required-batch-size-multiple 1 so that it translates every sentence. The ctranslate2
teacher is converted once before the rounds (its time is printed apart). Prints sentences/s of each, the
speed ratios against fairseq-generate and against the fairseq backend, the share of hypotheses identical
(token for token) to fairseq-generate's and to the fairseq backend's, BLEU against the reference, the
machine's load, and how many sentences fairseq-generate returns with its default batch-size multiple.
``--variant`` times our generator again with other arguments (workers, batch size, fp16, batches sized to the
GPU's free memory by --max-tokens auto) in the same rounds, each against the same fairseq-generate run; each
run's batch limits (what auto chose, too) are printed with its agreement.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


CONVERT = """import sys
from fairseq_plugins.teacher import TeacherEnsemble
from nat_kd.distill.backends.ctranslate2 import converted_model
converted_model(TeacherEnsemble.load([sys.argv[1]], sys.argv[2]), sys.argv[3])
"""


def bleu(hypotheses: list[str], references: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def agreement(work: Path, runners, split: str, tgt: str, prepared: PreparedCorpus, raw_split: str):
    """Print (and return) each decoder's identical share against fairseq-generate and the fairseq backend, and
    BLEU against the reference, from the first round's outputs."""
    import sentencepiece as spm

    ref = hypotheses(work / "fairseq-generate.0.log")
    pieces = {name: DistilledSet(work / f"{name}.0").pieces(split, tgt).read_text(encoding="utf-8").splitlines()
              for name in runners if name != "fairseq-generate"}
    n = len(pieces["nat_kd"])
    sp = spm.SentencePieceProcessor(model_file=str(prepared.spm_model))
    references = prepared.raw(raw_split, tgt).read_text(encoding="utf-8").splitlines()[:n]
    scores = {"fairseq-generate": bleu(sp.decode([ref.get(i, "").split() for i in range(n)]), references)}
    for name in pieces:
        scores[name] = bleu(DistilledSet(work / f"{name}.0").text(split, tgt).read_text(encoding="utf-8")
                            .splitlines(), references)
    print(f"fairseq-generate: returned {len(ref)} of {n}; BLEU {scores['fairseq-generate']:.2f}")
    for name in pieces:
        differing = [i for i in range(n) if ref.get(i) != pieces[name][i]]
        same_as_ours = sum(a == b for a, b in zip(pieces[name], pieces["nat_kd"]))
        meta = DistilledSet(work / f"{name}.0").meta()
        print(f"{name}: hypotheses identical to fairseq-generate: {n - len(differing)}/{n} "
              f"({100 * (n - len(differing)) / n:.2f}%)" + (f" (differ at ids {differing[:10]})" if differing else "")
              + ("" if name == "nat_kd" else f"; to the fairseq backend: {same_as_ours}/{n} "
                 f"({100 * same_as_ours / n:.2f}%)")
              + f"; BLEU {scores[name]:.2f} ({scores[name] - scores['nat_kd']:+.2f} vs the fairseq backend); "
              f"{meta['sentences']} lines; decode-only {meta['timing']['sentences_per_second']} sent/s with "
              f"{meta['timing']['workers']} worker(s) x {meta['timing']['threads_per_worker']} thread(s); batches "
              f"of up to {meta['batching']['max_tokens']} tokens and "
              f"{meta['batching']['max_sentences'] or 'any number of'} sentences"
              + (" (--max-tokens auto)" if "auto" in meta["batching"] else ""), flush=True)
    return ref, pieces, scores


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
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where both decoders run (cuda: the first GPU CUDA_VISIBLE_DEVICES shows)")
    p.add_argument("--fp16", action="store_true", help="both fairseq decoders in half precision (a GPU)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=0, help="our decoding processes (0: one per core)")
    p.add_argument("--backend", choices=["fairseq", "ctranslate2"], default="fairseq",
                   help="ctranslate2: also run our ctranslate2 backend, once per --compute-type, in every round")
    p.add_argument("--compute-type", nargs="+", default=["float32"], help="ctranslate2 compute types to run")
    p.add_argument("--ct2-max-tokens", type=int, default=None, help="ctranslate2 runs' --max-tokens (default: "
                   "the generator's default for that backend)")
    p.add_argument("--ct2-workers", type=int, default=0, help="ctranslate2 runs' --workers (0: the default)")
    p.add_argument("--ct2-threads", type=int, default=0, help="ctranslate2 runs' --threads (0: the default)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                   help="also time our generator with ARGS added to its command (a later flag wins), in every "
                        "round, e.g. w4='--workers 4', fp16=--fp16, big='--max-tokens 32000', auto='--max-tokens "
                        "auto'; repeatable")
    p.add_argument("--skip-default-count", action="store_true")
    args = p.parse_args()
    variants = {}
    for spec in args.variant:
        name, sep, extra = spec.partition("=")
        if not sep or name in ("", "fairseq-generate", "nat_kd", *variants) or "." in name or "/" in name:
            p.error(f"--variant {spec!r}: write NAME=ARGS with a new NAME (no dot or slash), e.g. w4='--workers 4'")
        variants[name] = extra

    prepared = PreparedCorpus(args.prepared)
    src, tgt = prepared.language_pair()
    work = Path(tempfile.mkdtemp(prefix="bench_generate."))
    split, data = args.split, prepared.bin.root
    if args.limit:
        data, split = subset(prepared, args.split, args.limit, work, src, tgt), "train"
    decoding = ["--beam", str(args.beam), "--lenpen", str(args.lenpen), "--max-len-a", "0",
                "--max-len-b", str(args.max_len_b)]
    common = [*decoding, "--max-tokens", str(args.max_tokens)]
    precision = ["--fp16"] if args.fp16 else []
    on_cpu = args.device == "cpu"
    fairseq = [sys.executable, "-m", "fairseq_cli.generate", str(data), "--user-dir", "fairseq_plugins",
               "--task", "translation", "--gen-subset", split, "--path", args.teacher, "--nbest", "1",
               "--source-lang", src, "--target-lang", tgt, *common, *precision, *(["--cpu"] if on_cpu else [])]
    ours = [sys.executable, "-m", "nat_kd.generate_distilled", "--teacher-path", args.teacher, "--data", str(data),
            "--split", split, "--spm-model", str(prepared.spm_model), "--teacher-data", str(prepared.bin.root),
            "--strategy", "beam", "--no-progress-bar"]
    runners = {"fairseq-generate": fairseq + ["--required-batch-size-multiple", "1"],
               "nat_kd": ours + [*common, *precision, "--workers", str(args.workers),
                                 "--device", "cpu" if on_cpu else "cuda"]}
    for name, extra in variants.items():
        runners[name] = runners["nat_kd"] + shlex.split(extra)
    if args.backend == "ctranslate2":
        cache = work / "ct2-cache"
        ct2 = ours + [*decoding, "--backend", "ctranslate2", "--ct2-cache", str(cache),
                      "--workers", str(args.ct2_workers), "--threads", str(args.ct2_threads)]
        if args.ct2_max_tokens:
            ct2 += ["--max-tokens", str(args.ct2_max_tokens)]
        # the one-time conversion, outside the timed runs
        seconds = run([sys.executable, "-c", CONVERT, args.teacher, str(prepared.bin.root), str(cache)],
                      work / "convert.log")
        print(f"ctranslate2 conversion (and start-up): {seconds:.1f} s, cached in {cache}", flush=True)
        for compute_type in args.compute_type:
            runners[f"ct2-{compute_type}"] = ct2 + ["--compute-type", compute_type]

    times = {name: [] for name in runners}
    for r in range(args.repeats):
        load = os.getloadavg()[0]
        for name, cmd in runners.items():
            log = work / f"{name}.{r}.log"
            times[name].append(run(cmd if name == "fairseq-generate" else cmd + ["--out", str(work / f"{name}.{r}")],
                                   log))
        print(f"round {r}: " + ", ".join(f"{name} {t[-1]:.1f} s" for name, t in times.items())
              + f" (1-min load average before: {load:.2f})", flush=True)
        if r == 0:  # what the decoders wrote, as soon as there is one of each
            ref, pieces, scores = agreement(work, runners, split, tgt, prepared, args.split)
    n = len(pieces["nat_kd"])
    best = {k: min(v) for k, v in times.items()}
    mean = {k: sum(v) / len(v) for k, v in times.items()}
    print(f"\nsentences: {n}; cores: {os.cpu_count()}; load average now: {os.getloadavg()}")
    for name, values in times.items():
        print(f"{name:17s} wall {', '.join(f'{v:.1f}' for v in values)} s -> best {n / best[name]:.1f} sent/s, "
              f"mean {n * len(values) / sum(values):.1f} sent/s; BLEU vs reference {scores[name]:.2f}")
    for name in runners:
        if name == "fairseq-generate":
            continue
        same_across_repeats = all(DistilledSet(work / f"{name}.{r}").text(split, tgt).read_bytes()
                                  == DistilledSet(work / f"{name}.0").text(split, tgt).read_bytes()
                                  for r in range(args.repeats))
        print(f"{name}: speed vs fairseq-generate best {best['fairseq-generate'] / best[name]:.2f}x, mean "
              f"{mean['fairseq-generate'] / mean[name]:.2f}x"
              + ("" if name == "nat_kd" else f"; vs the fairseq backend best {best['nat_kd'] / best[name]:.2f}x, "
                 f"mean {mean['nat_kd'] / mean[name]:.2f}x") + f"; identical across repeats: {same_across_repeats}")
    translated = re.search(r"Translated ([\d,]+) sentences .* in ([\d.]+)s \(([\d.]+) sentences/s",
                           (work / "fairseq-generate.0.log").read_text(encoding="utf-8"))
    if translated:
        print(f"fairseq-generate: decode-only {translated.group(3)} sent/s by its own timer "
              f"({translated.group(2)} s inside the generator); returned {len(ref)}")
    if not args.skip_default_count:
        # fairseq-generate's own defaults for batching: no --max-tokens, --required-batch-size-multiple 8
        at = fairseq.index("--max-tokens")
        default = fairseq[:at] + fairseq[at + 2:]
        run(default, work / "fairseq.default.log")
        print(f"plain fairseq-generate (default batching: no --max-tokens, --required-batch-size-multiple 8) returned "
              f"{len(hypotheses(work / 'fairseq.default.log'))} of {n} sentences; nat_kd returned {n}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
