"""Every setting that shapes a decode; recorded whole in meta.json."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DecodingSettings:
    strategy: str = "beam"
    beam: int = 5  # beam size for beam; K (the K-best list reranked) for seq-inter
    lenpen: float = 1.0  # fairseq's length penalty (scores divided by length ** lenpen)
    max_len_a: float = 0.0  # maximum output length = a * source length + b (fairseq's defaults)
    max_len_b: int = 200
    temperature: float = 1.0  # sampling, topk, topp
    top_k: int = 10  # topk
    top_p: float = 0.9  # topp
    seed: int = 1  # sampling, topk, topp: each sentence's stream is seeded by (seed, sentence index)
    seq_inter_metric: str = "bleu"  # seq-inter: sentence-level "bleu" or "chrf" against the reference

    def as_dict(self) -> dict:
        return asdict(self)
