"""Decoding speed of CTranslate2 thread layouts on this machine, to choose the ctranslate2 backend's defaults.

Decodes the first N lines of a sentencepiece-encoded source file with a converted teacher (the backend's
cache folder, ``.ctranslate2-cache/<key>``) in chunks, as the generator does, for each layout in turn and in
several rounds (alternating, so drift hits every layout alike); prints seconds and sentences per second, and
how many best hypotheses equal the first layout's. Only the decoding is timed: loading, detokenizing and
scoring are the same for every layout.

    python scripts/benchmarks/bench_ctranslate2_layouts.py --model DIR --source data/spm/train.en --limit 1500 --rounds 2
"""
from __future__ import annotations

import argparse
import time
from collections import deque

# (replicas = inter_threads, intra_threads, chunk sentences, CTranslate2 max_batch_size in tokens (0: whole
#  chunk), chunks queued ahead)
LAYOUTS = [(1, 2, 500, 0, 0), (2, 1, 500, 0, 1), (2, 1, 500, 2048, 1), (2, 1, 500, 1024, 1), (2, 1, 250, 0, 1)]


def decode(model: str, lines, compute_type: str, beam: int, layout) -> tuple[float, list]:
    import ctranslate2

    inter, intra, chunk, sub_batch, ahead = layout
    translator = ctranslate2.Translator(model, device="cpu", compute_type=compute_type, inter_threads=inter,
                                        intra_threads=intra)
    start, best, queued = time.perf_counter(), [], deque()
    for first in range(0, len(lines), chunk):
        queued.append(translator.translate_batch(lines[first:first + chunk], beam_size=beam, max_decoding_length=200,
                                                 max_batch_size=sub_batch, batch_type="tokens", asynchronous=True))
        while len(queued) > ahead:
            best += [r.result().hypotheses[0] for r in queued.popleft()]
    while queued:
        best += [r.result().hypotheses[0] for r in queued.popleft()]
    return time.perf_counter() - start, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a converted teacher (folder with model.bin)")
    parser.add_argument("--source", required=True, help="source lines as the teacher's pieces (e.g. data/spm/train.en)")
    parser.add_argument("--limit", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--compute-type", default="float32")
    args = parser.parse_args()
    with open(args.source, encoding="utf-8") as f:
        lines = [line.split() for _, line in zip(range(args.limit), f)]
    print(f"{len(lines)} sentences, beam {args.beam}, {args.compute_type}")
    print("round | replicas x intra-op threads | chunk | sub-batch tokens | queued ahead | seconds | sent/s | same as first")
    for round_ in range(args.rounds):
        reference = None
        for layout in LAYOUTS:
            seconds, best = decode(args.model, lines, args.compute_type, args.beam, layout)
            reference = reference or best
            inter, intra, chunk, sub_batch, ahead = layout
            print(f"{round_} | {inter} x {intra} | {chunk} | {sub_batch or 'whole chunk'} | {ahead} | {seconds:.1f} | "
                  f"{len(lines) / seconds:.1f} | {sum(a == b for a, b in zip(reference, best))}", flush=True)


if __name__ == "__main__":
    main()
