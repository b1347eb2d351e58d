"""Beam search and greedy decoding: fairseq's BeamSearch as fairseq-generate runs it."""
from .base import DecodingStrategy


class Beam(DecodingStrategy):
    name = "beam"


class Greedy(DecodingStrategy):
    """Beam search with beam 1, which is what fairseq-generate --beam 1 does."""

    name = "greedy"
    used_settings = ("max_len_a", "max_len_b")

    @property
    def beam_size(self) -> int:
        return 1
