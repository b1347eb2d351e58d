"""Does a training set keep the real data's rare words? For the sentences whose source holds a word seen once in
the source side, the share whose target holds a word seen once in that set's own targets: the references keep
a rare source word's rare translation; a teacher that barely knows the word writes a common one instead.

    python scripts/experiments/rare_words.py --source RAW/train.en --target real=RAW/train.de \
        --target beam=DISTILLED/train.de [--examples 3]

Words are compared lowercased, without punctuation, split on whitespace (detokenized text, as written).
"""
from __future__ import annotations

import argparse
import collections
import random
import re
import sys

from nat_kd.corpus import read_lines

_NOT_WORD = re.compile(r"[^\w]")


def words(line: str) -> list[str]:
    return [w for w in (_NOT_WORD.sub("", t.lower()) for t in line.split()) if w]


def singletons(lines: list[list[str]]) -> set[str]:
    counts = collections.Counter(w for line in lines for w in line)
    return {w for w, n in counts.items() if n == 1}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True)
    p.add_argument("--target", action="append", required=True, metavar="NAME=FILE",
                   help="a training set's targets, line-aligned with --source (repeatable)")
    p.add_argument("--examples", type=int, default=0, help="print this many sentences of each set at random")
    args = p.parse_args(argv)
    source = [words(line) for line in read_lines(args.source)]
    rare = singletons(source)
    chosen = [i for i, line in enumerate(source) if rare.intersection(line)]
    print(f"{len(chosen):,} of {len(source):,} sentences hold one of the {len(rare):,} source words seen once")
    for spec in args.target:
        name, _, path = spec.partition("=")
        target = [words(line) for line in read_lines(path)]
        if len(target) != len(source):
            print(f"{path}: {len(target):,} lines for {len(source):,} source lines", file=sys.stderr)
            return 2
        own_rare = singletons(target)
        share = sum(bool(own_rare.intersection(target[i])) for i in chosen) / max(len(chosen), 1)
        print(f"{name}: {share:.3f} of them have a target word seen once in {name}'s targets")
        for i in random.Random(1).sample(chosen, min(args.examples, len(chosen))):
            print(f"    {sorted(rare.intersection(source[i]))}: {' '.join(target[i])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
