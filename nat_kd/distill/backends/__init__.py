"""Decoding backends: what turns a batch of source sentences into each sentence's n-best hypotheses.

    fairseq      fairseq's SequenceGenerator on the teacher's PyTorch modules (the default and the reference:
                 beam search gives fairseq-generate's hypotheses token for token; any architecture, ensembles)
    ctranslate2  the teacher converted once to CTranslate2 (cached by its content hash) and decoded by it:
                 faster on the CPU (docs/generate_distilled.md), for single transformer checkpoints

Each backend class has ``describe(cfg, device)`` (meta.json's ``backend``, part of the run's fingerprint),
``check(session)`` (refuses what it cannot decode, before anything is written), ``prepare(session)`` (run
once in the main process before the workers start), ``decode(ids)``, and ``submit(ids)``, whose ``result()``
gives ``decode``'s answer: a backend that decodes in its own threads returns at once, so the caller can queue
more work meanwhile.
Both take the same batches (the chunk plan) and return, per sentence, ``Hypothesis`` objects best first;
``workers.ChunkDecoder`` picks one (the strategy's rule) and detokenizes it. A backend never detokenizes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from nat_kd.errors import SettingsError

if TYPE_CHECKING:
    from ..workers import Session

BACKENDS = ("fairseq", "ctranslate2")


class Hypothesis(NamedTuple):
    pieces: str  # the target tokens (the teacher's dictionary symbols), space-separated, no EOS
    logprob: float  # the teacher's log-probability of the tokens and EOS, divided by their number


def backend_class(name: str):
    if name == "fairseq":
        from .fairseq import FairseqBackend

        return FairseqBackend
    if name == "ctranslate2":
        from .ctranslate2 import CTranslate2Backend

        return CTranslate2Backend
    raise SettingsError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")


def build_backend(session: Session, threads: int = 1):
    """The configured backend (``session.cfg.backend``) for one process, with ``threads`` CPU threads."""
    return backend_class(session.cfg.backend)(session, threads)
