"""Decoding backends: what turns a batch of source sentences into each sentence's n-best hypotheses.

    fairseq      fairseq's SequenceGenerator on the teacher's PyTorch modules (the default and the reference:
                 beam search gives fairseq-generate's hypotheses token for token; any architecture, ensembles)
    ctranslate2  the teacher converted once to CTranslate2 (cached by its content hash) and decoded by it:
                 faster on the CPU (docs/generate_distilled.md), for single transformer checkpoints

A backend is built from plain values, ``Backend(BackendSettings, BackendInputs, threads)`` (base.py), and
never sees the run's session or pipeline. Each backend class has ``describe(settings)`` (meta.json's
``backend``, part of the run's fingerprint), ``check(settings, teacher)`` (refuses what it cannot decode, before
anything is written), ``prepare(settings, teacher)`` (run once in the main process before the workers start),
``decode(ids)``, and ``submit(ids)``, whose ``result()``
gives ``decode``'s answer: a backend that decodes in its own threads returns at once, so the caller can queue
more work meanwhile (CTranslate2, and fairseq on a GPU); ``close()``, where a backend has it, stops those
threads (``workers.ChunkDecoder.close``).
Both take the same batches (the chunk plan) and return, per sentence, ``Hypothesis`` objects best first;
``workers.ChunkDecoder`` picks one (the strategy's rule) and detokenizes it. A backend never detokenizes.
"""
from __future__ import annotations

from nat_kd.errors import SettingsError

from .base import BackendInputs, BackendSettings, Hypothesis

__all__ = ["BACKENDS", "BackendInputs", "BackendSettings", "Hypothesis", "backend_class", "build_backend"]

BACKENDS = ("fairseq", "ctranslate2")


def backend_class(name: str):
    if name == "fairseq":
        from .fairseq import FairseqBackend

        return FairseqBackend
    if name == "ctranslate2":
        from .ctranslate2 import CTranslate2Backend

        return CTranslate2Backend
    raise SettingsError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")


def build_backend(settings: BackendSettings, inputs: BackendInputs, threads: int = 1):
    """The backend ``settings.name`` for one process, with ``threads`` CPU threads."""
    return backend_class(settings.name)(settings, inputs, threads)
