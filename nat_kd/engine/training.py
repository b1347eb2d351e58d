"""How a model is trained: fairseq-train's budget and optimiser settings, and the students' shape, as every
command that trains reads them (the study's config, choose's pilots, next_steps' commands)."""
from __future__ import annotations

from dataclasses import dataclass, replace

TRAINING_SPEED_INTERVAL = 10  # fairseq-train's --log-interval in a training-speed run
STUDIES_SHAPE = "2x128"  # every committed study's students: what the pilots' agreement was measured at
ARCH_SHAPE = "arch"  # a --shape that keeps the architecture's own sizes


@dataclass(frozen=True)
class Training:
    """How one kind of model is trained: fairseq-train's budget and optimiser settings."""
    updates: int
    max_tokens: int = 4096
    lr: float = 1e-3
    warmup: int = 100
    label_smoothing: float = 0.1  # students whose loss has none get 0 (used_by)
    validate_every: int = 0  # updates between validations (0: every epoch)
    weight_decay: float = 0.0
    # Validation BLEU every N updates (0: never): the learning curve, and the checkpoint kept is the one with
    # the best validation BLEU instead of fairseq's best validation loss (see curve.py).
    bleu_every: int = 0
    patience: int = 0  # stop after this many BLEU measurements without a new best (0: train all updates)
    # glancing students (GLAT, CTC with glancing, DA-Transformer): the updates over which the glancing ratio
    # anneals from its start to its end (0: the family's default, the reference code's: GLAT's 300k updates,
    # the DA-Transformer's 200k)
    glance_anneal_updates: int = 0

    def used_by(self, nat_family: str | None) -> Training:
        """These settings as a model of ``nat_family`` (None: an AT teacher) trains with them: label smoothing 0
        for a student whose loss has none, no glancing schedule for one that does not glance. A step's fingerprint
        is made of these, so a setting the model never reads retrains nothing when it changes."""
        if nat_family is None:
            return self
        from fairseq_plugins.models.nat import STUDENT_FAMILIES

        family = STUDENT_FAMILIES[nat_family]
        return replace(self, label_smoothing=self.label_smoothing if family.label_smoothing else 0.0,
                       glance_anneal_updates=self.glance_anneal_updates if family.glancing else 0)
