"""The decoding strategies: each one a fairseq search, a beam size, and a rule to pick one of the n-best.

    beam       fairseq's beam search as fairseq-generate runs it, best hypothesis
    greedy     beam search with beam 1 (what fairseq-generate --beam 1 does)
    sampling   one true ancestral sample per sentence (not the best of several, as fairseq --sampling --beam N)
    topk       the same, from the k most probable tokens
    topp       the same, from the nucleus (Holtzman et al., 2019)
    seq-inter  sequence-level interpolation (Kim & Rush, 2016): of the teacher's K-best, the one closest to
               the reference by sentence-level BLEU (or chrF), as sacrebleu computes them; ties keep the
               teacher's order
"""
from __future__ import annotations

from dataclasses import dataclass

import sacrebleu
from fairseq.search import BeamSearch, Search
from fairseq.sequence_generator import SequenceGenerator

from nat_kd.errors import SettingsError

from .ensemble import LeanEnsembleModel
from .sampling import ReproducibleSampling

SEQ_INTER_METRICS = ("bleu", "chrf")


@dataclass(frozen=True)
class DecodingSettings:
    """Every setting that shapes a decode; recorded whole in meta.json."""

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
            raise SettingsError(f"{self.name}: beam size must be >= 1, got {self.beam_size}")

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


class Beam(DecodingStrategy):
    name = "beam"


class Greedy(DecodingStrategy):
    name = "greedy"
    used_settings = ("max_len_a", "max_len_b")

    @property
    def beam_size(self) -> int:
        return 1


class Sampling(DecodingStrategy):
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
            raise SettingsError(f"{self.name}: temperature must be > 0, got {self.settings.temperature}")

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
            raise SettingsError(f"topk: k must be >= 1, got {self.settings.top_k}")


class TopP(Sampling):
    name = "topp"
    used_settings = ("top_p", "temperature", "seed", "max_len_a", "max_len_b")

    @property
    def top_p(self) -> float:
        return self.settings.top_p

    def validate(self) -> None:
        super().validate()
        if not 0 < self.settings.top_p <= 1:
            raise SettingsError(f"topp: p must be in (0, 1], got {self.settings.top_p}")


class SeqInter(DecodingStrategy):
    name = "seq-inter"
    needs_reference = True
    used_settings = ("beam", "lenpen", "max_len_a", "max_len_b", "seq_inter_metric")

    def validate(self) -> None:
        super().validate()
        if self.settings.seq_inter_metric not in SEQ_INTER_METRICS:
            raise SettingsError(f"seq-inter metric must be one of {SEQ_INTER_METRICS}, "
                                f"got {self.settings.seq_inter_metric!r}")
        # one metric object, reused: sacrebleu's sentence_score needs effective order for short sentences
        self._metric = (sacrebleu.BLEU(effective_order=True) if self.settings.seq_inter_metric == "bleu"
                        else sacrebleu.CHRF())

    def choose(self, candidates: list[str], reference: str | None) -> int:
        if reference is None:
            raise SettingsError("seq-inter needs the reference of every sentence")
        scores = [self._metric.sentence_score(hyp, [reference]).score for hyp in candidates]
        return max(range(len(candidates)), key=lambda i: (scores[i], -i))


# Strategy name -> class; the CLI's --strategy choices come from here.
STRATEGIES: dict[str, type[DecodingStrategy]] = {
    cls.name: cls for cls in (Beam, Greedy, Sampling, TopK, TopP, SeqInter)
}


def build_strategy(settings: DecodingSettings) -> DecodingStrategy:
    if settings.strategy not in STRATEGIES:
        raise SettingsError(f"unknown strategy {settings.strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[settings.strategy](settings)
