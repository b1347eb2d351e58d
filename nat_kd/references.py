"""``python -m nat_kd.references``: distilled sets of the same sources as one set of several references a line,
or as their union (nat_kd/distill/references.py)."""
import sys

from nat_kd.distill.references import main

if __name__ == "__main__":
    sys.exit(main())
