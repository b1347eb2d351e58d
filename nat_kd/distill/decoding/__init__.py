"""Decoding strategies for re-decoding a corpus with a teacher: beam, greedy, sampling, topk, topp, seq-inter."""
from .base import DecodingStrategy
from .registry import STRATEGIES, build_strategy
from .settings import DecodingSettings

__all__ = ["DecodingStrategy", "DecodingSettings", "STRATEGIES", "build_strategy"]
