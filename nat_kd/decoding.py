"""Deprecated path, kept until nat_kd.study imports ``nat_kd.distill.decoding``: re-exports it."""
from nat_kd.distill.decoding import STRATEGIES, DecodingSettings, DecodingStrategy, build_strategy  # noqa: F401
