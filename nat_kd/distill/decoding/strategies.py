"""What every decoding strategy is: a fairseq search, a beam size, and a rule to pick one of the n-best."""
from __future__ import annotations

from fairseq.search import BeamSearch, Search
from fairseq.sequence_generator import SequenceGenerator

from .ensemble import LeanEnsembleModel
from .settings import DecodingSettings


class DecodingStrategy:
    """Default: beam search, keep the best hypothesis. Subclasses change the search or the choice."""

    name = "beam"
    needs_reference = False
    # The settings that matter for this strategy (the others are recorded but ignored).
    used_settings = ("beam", "lenpen", "max_len_a", "max_len_b")

    def __init__(self, settings: DecodingSettings):
        self.settings = settings
        self.validate()

    def validate(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"{self.name}: beam size must be >= 1, got {self.beam_size}")

    @property
    def beam_size(self) -> int:
        return self.settings.beam

    @property
    def temperature(self) -> float:
        return 1.0

    def search(self, tgt_dict) -> Search:
        return BeamSearch(tgt_dict)

    def build_generator(self, models, tgt_dict) -> SequenceGenerator:
        """fairseq's SequenceGenerator with the same arguments fairseq-generate gives it (and the same
        numbers: LeanEnsembleModel only skips copies the decode does not need)."""
        s = self.settings
        return SequenceGenerator(
            LeanEnsembleModel(list(models)), tgt_dict, beam_size=self.beam_size, max_len_a=s.max_len_a, max_len_b=s.max_len_b,
            min_len=1, normalize_scores=True, len_penalty=s.lenpen, unk_penalty=0.0,
            temperature=self.temperature, match_source_len=False, no_repeat_ngram_size=0,
            search_strategy=self.search(tgt_dict),
        )

    def choose(self, candidates: list[str], reference: str | None) -> int:
        """Index of the hypothesis to keep among the n-best (detokenized); fairseq sorts them best first."""
        return 0

    def describe(self) -> dict:
        return {"name": self.name, **{key: getattr(self.settings, key) for key in self.used_settings}}
