"""The backend contract: what every backend is given (plain settings, the loaded inputs), what it gives back
(n-best hypotheses), what it decides for the run (its policy), and the methods the generator calls.

``Decoder`` is what ``chunk_decoder.ChunkDecoder`` drives: a registered backend, or a reference a backend is
checked against (``transformers_reference.py``). ``Backend`` is a decoder that ``--backend NAME`` chooses
(the registry: backends/__init__.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from ..decoding import DecodingSettings


class Hypothesis(NamedTuple):
    pieces: str  # the target tokens (the teacher's dictionary symbols), space-separated, no EOS
    logprob: float  # the teacher's log-probability of the tokens and EOS, divided by their number


Decoded = list[tuple[int, list[Hypothesis]]]  # (sentence id, its n-best hypotheses, best first), per sentence


@dataclass(frozen=True)
class BackendSettings:
    """The run's settings a backend reads (built from the DistillConfig by loaded.LoadedRun)."""

    name: str  # the backend's registered name
    decoding: DecodingSettings
    device: str = "cpu"
    compute_type: str = "float32"  # a backend that takes --compute-type
    fp16: bool = False  # a backend that takes --fp16, on a GPU
    cache: str | None = None  # a backend with a converter: the folder of converted teachers


@dataclass(frozen=True)
class BackendInputs:
    """What a backend decodes: the loaded teacher and the corpus in its tokens."""

    teacher: Any  # fairseq_plugins.teacher.TeacherEnsemble, or a teachers.PublishedTeacher
    source_tokens: list  # torch tensors, each ending with EOS
    dataset: Any  # fairseq's LanguagePairDataset of them (its collater builds the fairseq backend's batches)


class SubmittedBatch(Protocol):
    """A submitted batch: ``result()`` waits for it and returns ``decode``'s answer, or raises its error."""

    def result(self) -> Decoded: ...


class DecodedBatch:
    """A batch already decoded, behind the ``result()`` of a submitted one."""

    def __init__(self, decoded: Decoded):
        self.decoded = decoded

    def result(self) -> Decoded:
        return self.decoded


class Decoder(ABC):
    """Turns a batch of source sentences (ids into the corpus) into each sentence's n-best hypotheses. It never
    detokenizes: ChunkDecoder picks one hypothesis per sentence (the strategy's rule) and detokenizes it."""

    @abstractmethod
    def decode(self, ids: list[int]) -> Decoded:
        """(sentence id, n-best hypotheses, best first) for each sentence of one batch."""

    def submit(self, ids: list[int]) -> SubmittedBatch:
        """The batch behind ``result()``. A decoder that works in its own threads returns at once, so that the
        caller queues more work meanwhile (CTranslate2, and fairseq on a GPU); this one decodes now."""
        return DecodedBatch(self.decode(ids))

    def close(self) -> None:
        """Stop the decoder's own threads, if it has any (none here); called when the caller is done or stopped."""


class Backend(Decoder):
    """A decoding backend. Built once per process as ``Backend(settings, inputs, threads)``, from plain values:
    it never sees the run's loaded or pipeline. Its class attributes are its policy, which the settings'
    checks (config.py), the loaded run (`distill/loaded.py`) and the process pool read instead of its name."""

    name: ClassVar[str]  # what --backend and DistillConfig.backend call it
    # the decoding strategies (decoding/strategies.py) it carries out, by name; none: it decodes its own way, so
    # a run with it takes no decoding settings, and its meta.json and card record no strategy
    strategies: ClassVar[tuple[str, ...]] = ()
    cpu_workers: ClassVar[int | None] = None  # decoding processes on a CPU without --workers; None: one per core
    takes_fp16: ClassVar[bool] = False  # --fp16: the teacher in half precision, on a GPU
    takes_compute_type: ClassVar[bool] = False  # --compute-type other than float32
    max_tokens_auto: ClassVar[bool] = False  # --max-tokens auto sizes its batches (autobatch.py)
    pytorch_teacher: ClassVar[bool] = False  # decodes with the teacher's PyTorch modules: moved to the run's device
    decodes_published_teachers: ClassVar[bool] = False  # a published teacher's folder (teachers.py)
    # what converts a fairseq teacher into this backend's format, recorded in meta.json's teacher; the converted
    # copies are kept in the conversion cache (--ct2-cache), BackendSettings.cache
    converter: ClassVar[str | None] = None
    reference: ClassVar[bool] = False  # the backend --check-against-fairseq checks the others against

    @abstractmethod
    def __init__(self, settings: BackendSettings, inputs: BackendInputs, threads: int = 1):
        """One process's backend, with ``threads`` CPU threads (torch's, or CTranslate2's model replicas)."""

    @classmethod
    def describe(cls, settings: BackendSettings) -> dict:
        """meta.json's ``backend``: part of the run's fingerprint, so a saved plan or finished set made with
        other values is not reused."""
        return {"name": cls.name}

    @classmethod
    def check(cls, settings: BackendSettings, teacher) -> None:
        """Refuse what this backend cannot decode (a SettingsError), before anything is written."""

    @classmethod
    def prepare(cls, settings: BackendSettings, teacher) -> None:
        """Run once in the main process before the workers start (a conversion the workers then find)."""

    @classmethod
    def set_up_process(cls, device: str) -> None:
        """Run in every process that decodes or checks, before the teacher is loaded."""

    @classmethod
    def converter_version(cls) -> str | None:
        """The version of ``converter``, recorded beside it."""
        return None
