"""Strategy name -> class; the CLI's --strategy choices come from here."""
from __future__ import annotations

from .base import DecodingStrategy
from .beam import Beam, Greedy
from .sampling_strategies import Sampling, TopK, TopP
from .seq_inter import SeqInter
from .settings import DecodingSettings

STRATEGIES: dict[str, type[DecodingStrategy]] = {
    cls.name: cls for cls in (Beam, Greedy, Sampling, TopK, TopP, SeqInter)
}


def build_strategy(settings: DecodingSettings) -> DecodingStrategy:
    if settings.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {settings.strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[settings.strategy](settings)
