"""Strategies on top of the reproducible sampling search: plain ancestral, top-k, nucleus (top-p)."""
from .base import DecodingStrategy
from .sampling import ReproducibleSampling


class Sampling(DecodingStrategy):
    """One true ancestral sample per sentence (not the best of several, as fairseq --sampling --beam N)."""

    name = "sampling"
    used_settings = ("temperature", "seed", "max_len_a", "max_len_b")
    top_k, top_p = -1, -1.0

    @property
    def beam_size(self) -> int:
        return 1

    @property
    def temperature(self) -> float:
        return self.settings.temperature

    def validate(self) -> None:
        if self.settings.temperature <= 0:
            raise ValueError(f"{self.name}: temperature must be > 0, got {self.settings.temperature}")

    def search(self, tgt_dict):
        return ReproducibleSampling(tgt_dict, self.settings.seed, top_k=self.top_k, top_p=self.top_p)


class TopK(Sampling):
    name = "topk"
    used_settings = ("top_k", "temperature", "seed", "max_len_a", "max_len_b")

    @property
    def top_k(self) -> int:
        return self.settings.top_k

    def validate(self) -> None:
        super().validate()
        if self.settings.top_k < 1:
            raise ValueError(f"topk: k must be >= 1, got {self.settings.top_k}")


class TopP(Sampling):
    name = "topp"
    used_settings = ("top_p", "temperature", "seed", "max_len_a", "max_len_b")

    @property
    def top_p(self) -> float:
        return self.settings.top_p

    def validate(self) -> None:
        super().validate()
        if not 0 < self.settings.top_p <= 1:
            raise ValueError(f"topp: p must be in (0, 1], got {self.settings.top_p}")
