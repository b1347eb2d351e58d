"""What every backend is given and gives back: plain settings, the loaded inputs, and n-best hypotheses."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ..decoding import DecodingSettings


class Hypothesis(NamedTuple):
    pieces: str  # the target tokens (the teacher's dictionary symbols), space-separated, no EOS
    logprob: float  # the teacher's log-probability of the tokens and EOS, divided by their number


@dataclass(frozen=True)
class BackendSettings:
    """The run's settings a backend reads (built from the DistillConfig by workers.Session)."""

    name: str  # the backend: one of BACKENDS
    decoding: DecodingSettings
    device: str = "cpu"
    compute_type: str = "float32"  # ctranslate2
    fp16: bool = False  # fairseq on a GPU
    cache: str | None = None  # ctranslate2: the folder of converted teachers


@dataclass(frozen=True)
class BackendInputs:
    """What a backend decodes: the loaded teacher and the corpus in its tokens."""

    teacher: Any  # fairseq_plugins.teacher.TeacherEnsemble
    source_tokens: list  # torch tensors, each ending with EOS
    dataset: Any  # fairseq's LanguagePairDataset of them (its collater builds the fairseq backend's batches)


class DecodedBatch:
    """A batch already decoded, behind the ``result()`` of a queued one (see ``backends``)."""

    def __init__(self, decoded: list[tuple[int, list[Hypothesis]]]):
        self.decoded = decoded

    def result(self) -> list[tuple[int, list[Hypothesis]]]:
        return self.decoded
