"""Print the architecture table of docs/architectures.md: every registered kd_* architecture, its parameter count on the
prepared Multi30k vocabulary and on a 40k vocabulary, and the flags that train it.

    .venv/bin/python scripts/benchmarks/count_params.py [--multi30k-vocab 8008]
"""
import argparse
import logging

logging.basicConfig(level=logging.WARNING)  # before fairseq: it would otherwise turn on DEBUG logging

import fairseq_plugins  # noqa: E402,F401
from fairseq_plugins.counting import count_parameters  # noqa: E402
from fairseq_plugins.models.nat import STUDENT_ARCHS, STUDENT_FAMILIES  # noqa: E402
from fairseq_plugins.models.transformer import TRANSFORMER_ARCHS  # noqa: E402

TRANSFORMER_FLAGS = "--task translation --criterion label_smoothed_cross_entropy --label-smoothing 0.1"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--multi30k-vocab", type=int, default=8008,
                        help="entries of the prepared joined dictionary (8008 for en-de, spm 8000)")
    args = parser.parse_args()
    print(f"| architecture | params (Multi30k, {args.multi30k_vocab} types) | params (40k) | training flags |")
    print("|---|---:|---:|---|")
    rows = [(arch, TRANSFORMER_FLAGS) for arch in TRANSFORMER_ARCHS]
    for arch, (family, _) in STUDENT_ARCHS.items():
        spec = STUDENT_FAMILIES[family]
        flags = " ".join((f"--task {spec.task} --criterion nat_loss", *spec.train_flags))
        rows.append((arch, flags))
    for arch, flags in rows:
        small, big = count_parameters(arch, args.multi30k_vocab), count_parameters(arch, 40000)
        print(f"| `{arch}` | {small / 1e6:.1f}M | {big / 1e6:.1f}M | `{flags}` |", flush=True)


if __name__ == "__main__":
    main()
