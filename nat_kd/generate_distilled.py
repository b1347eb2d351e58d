"""``python -m nat_kd.generate_distilled``: the generator's command line (nat_kd.distill.__main__)."""
import sys

from nat_kd.distill.__main__ import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
