"""Decoding backends: what turns a batch of source sentences into each sentence's n-best hypotheses.

    fairseq      fairseq's SequenceGenerator on the teacher's PyTorch modules (the default and the reference:
                 beam search gives fairseq-generate's hypotheses token for token; any architecture, ensembles)
    ctranslate2  the teacher converted once to CTranslate2 (cached by its content hash) and decoded by it:
                 faster on the CPU (docs/results/generator_speed.md), for single transformer checkpoints and
                 published teachers' folders

The contract is ``base.Backend``. The registry below maps each name to its class; a built-in backend's module
is imported only when a run names it, and a backend's own engine (ctranslate2, say) only when it decodes. A
backend defined elsewhere is added with ``register_backend`` (docs/extending.md, "Add a backend").
"""
from __future__ import annotations

import importlib

from nat_kd.errors import SettingsError

from .base import Backend, BackendInputs, BackendSettings, Decoder, Hypothesis

__all__ = ["DEFAULT_BACKEND", "PUBLISHED_TEACHER_BACKEND", "Backend", "BackendInputs", "BackendSettings", "Decoder",
           "Hypothesis", "backend_class", "backend_names", "build_backend", "names_carrying_out", "names_with",
           "register_backend"]

DEFAULT_BACKEND = "fairseq"
PUBLISHED_TEACHER_BACKEND = "ctranslate2"  # the default for a published teacher's folder

# name -> its class, or "module:class" to import it from on first use
_BACKENDS: dict[str, type[Backend] | str] = {
    "fairseq": "nat_kd.distill.backends.fairseq:FairseqBackend",
    "ctranslate2": "nat_kd.distill.backends.ctranslate2:CTranslate2Backend",
}


def _where(backend: type[Backend] | str) -> str:
    return backend if isinstance(backend, str) else f"{backend.__module__}:{backend.__qualname__}"


def register_backend(backend: type[Backend]) -> type[Backend]:
    """Add ``backend`` under its ``name`` (usable as a class decorator). The same class again changes nothing; a
    name that another class holds is refused. The generator's worker processes register the run's backend
    themselves, so a class defined in any importable module serves them too."""
    known = _BACKENDS.get(backend.name)
    if known is not None and _where(known) != _where(backend):
        raise ValueError(f"backend {backend.name!r} is {_where(known)} already, not {_where(backend)}")
    _BACKENDS[backend.name] = backend
    return backend


def backend_names() -> list[str]:
    return list(_BACKENDS)


def backend_class(name: str) -> type[Backend]:
    known = _BACKENDS.get(name)
    if known is None:
        raise SettingsError(f"unknown backend {name!r}: choose one of {', '.join(_BACKENDS)}")
    if isinstance(known, str):
        module, _, qualname = known.partition(":")
        known = _BACKENDS[name] = getattr(importlib.import_module(module), qualname)
    return known


def names_with(policy: str, value: bool = True) -> list[str]:
    """The backends whose class attribute ``policy`` is ``value`` (for the messages that say which take an
    option)."""
    return [name for name in _BACKENDS if getattr(backend_class(name), policy) == value]


def names_carrying_out(strategy: str) -> list[str]:
    """The backends whose ``strategies`` include ``strategy``."""
    return [name for name in _BACKENDS if strategy in backend_class(name).strategies]


def build_backend(settings: BackendSettings, inputs: BackendInputs, threads: int = 1) -> Backend:
    """The backend ``settings.name`` for one process, with ``threads`` CPU threads."""
    return backend_class(settings.name)(settings, inputs, threads)
