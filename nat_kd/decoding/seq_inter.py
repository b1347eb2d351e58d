"""Sequence-level interpolation (Kim & Rush, 2016): of the teacher's K-best, keep the one closest to the
reference by sentence-level BLEU (or chrF), as sacrebleu computes them. Ties keep the teacher's order."""
from __future__ import annotations

import sacrebleu

from .base import DecodingStrategy

METRICS = ("bleu", "chrf")


class SeqInter(DecodingStrategy):
    name = "seq-inter"
    needs_reference = True
    used_settings = ("beam", "lenpen", "max_len_a", "max_len_b", "seq_inter_metric")

    def validate(self) -> None:
        super().validate()
        if self.settings.seq_inter_metric not in METRICS:
            raise ValueError(f"seq-inter metric must be one of {METRICS}, got {self.settings.seq_inter_metric!r}")
        # one metric object, reused: sacrebleu's sentence_score needs effective order for short sentences
        self._metric = (sacrebleu.BLEU(effective_order=True) if self.settings.seq_inter_metric == "bleu"
                        else sacrebleu.CHRF())

    def choose(self, candidates: list[str], reference: str | None) -> int:
        if reference is None:
            raise ValueError("seq-inter needs the reference of every sentence")
        scores = [self._metric.sentence_score(hyp, [reference]).score for hyp in candidates]
        return max(range(len(candidates)), key=lambda i: (scores[i], -i))
