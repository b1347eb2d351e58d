"""Decoding strategies for re-decoding a corpus with a teacher: beam, greedy, sampling, topk, topp, seq-inter."""
from .strategies import STRATEGIES, DecodingSettings, DecodingStrategy, build_strategy

__all__ = ["DecodingStrategy", "DecodingSettings", "STRATEGIES", "build_strategy"]
