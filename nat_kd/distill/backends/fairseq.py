"""The fairseq backend: the teacher's own PyTorch modules and fairseq's SequenceGenerator (the reference).

Beam search and greedy give fairseq-generate's hypotheses token for token when batched as it batches
(docs/generate_distilled.md); any fairseq architecture and ensembles work.
"""
from __future__ import annotations

from ..decoding import build_strategy
from ..source import token_strings
from .base import BackendInputs, BackendSettings, DecodedBatch, Hypothesis


class FairseqBackend:
    name = "fairseq"

    def __init__(self, settings: BackendSettings, inputs: BackendInputs, threads: int = 1):
        # threads: torch's, set by the worker
        strategy = build_strategy(settings.decoding)
        self.teacher, self.dataset, self.device = inputs.teacher, inputs.dataset, settings.device
        self.nbest = strategy.beam_size if strategy.needs_reference else 1
        self.generator = strategy.build_generator(self.teacher.models, self.teacher.tgt_dict)

    @staticmethod
    def check(settings: BackendSettings, teacher) -> None:
        """Any fairseq model decodes here."""

    @staticmethod
    def prepare(settings: BackendSettings, teacher) -> None:
        """Nothing to prepare: every worker loads the checkpoint itself."""

    @staticmethod
    def describe(settings: BackendSettings) -> dict:
        """meta.json's ``backend``."""
        return {"name": FairseqBackend.name, "fp16": settings.fp16}

    def submit(self, ids: list[int]) -> "DecodedBatch":
        """The batch decoded now (fairseq decodes in the calling thread); ``result()`` returns it."""
        return DecodedBatch(self.decode(ids))

    def decode(self, ids: list[int]) -> list[tuple[int, list[Hypothesis]]]:
        """(sentence id, n-best hypotheses, best first) for each sentence of one batch."""
        sample = self.dataset.collater([self.dataset[i] for i in ids])
        if self.device != "cpu":
            from fairseq import utils
            sample = utils.move_to_cuda(sample, device=self.device)
        hypos = self.teacher.task.inference_step(self.generator, self.teacher.models, sample)
        kept = [nbest[: self.nbest] for nbest in hypos]
        pieces = iter(token_strings(self.teacher.tgt_dict, [h["tokens"].cpu() for nbest in kept for h in nbest]))
        return [(sentence_id, [Hypothesis(next(pieces), float(h["positional_scores"].float().mean())) for h in nbest])
                for sentence_id, nbest in zip(sample["id"].tolist(), kept)]
