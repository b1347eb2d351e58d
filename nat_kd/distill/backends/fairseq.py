"""The fairseq backend: the teacher's own PyTorch modules and fairseq's SequenceGenerator (the reference).

Beam search and greedy give fairseq-generate's hypotheses token for token when batched as it batches
(docs/generate_distilled.md); any fairseq architecture and ensembles work.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from ..decoding import STRATEGIES, build_strategy
from ..source import token_strings
from .base import Backend, BackendInputs, BackendSettings, Decoded, DecodedBatch, Hypothesis


class FairseqBackend(Backend):
    name = "fairseq"
    strategies = tuple(STRATEGIES)
    takes_fp16 = True
    max_tokens_auto = True  # autobatch.py bounds SequenceGenerator's memory
    pytorch_teacher = True
    reference = True

    def __init__(self, settings: BackendSettings, inputs: BackendInputs, threads: int = 1,
                 background: bool | None = None):
        # threads: torch's, set by the worker
        strategy = build_strategy(settings.decoding)
        self.teacher, self.dataset, self.device = inputs.teacher, inputs.dataset, settings.device
        self.nbest = strategy.beam_size if strategy.needs_reference else 1
        self.generator = strategy.build_generator(self.teacher.models, self.teacher.tgt_dict)
        # background (default: on a GPU): ``submit`` hands the batch to one thread of our own and returns at once,
        # so the GPU decodes the next chunk while the caller detokenizes, scores and saves this one
        # (pool.decode_here queues a chunk before finishing the last). One thread decodes the batches one
        # at a time in submission order, each exactly as ``decode`` would (grad mode is per thread: fairseq's
        # task.inference_step turns gradients off itself). Not on the CPU: there torch already runs one thread
        # per core, and a second busy thread would oversubscribe them.
        self.background = settings.device != "cpu" if background is None else background
        self._executor = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="nat-kd-fairseq")
                          if self.background else None)

    @classmethod
    def describe(cls, settings: BackendSettings) -> dict:
        return {"name": cls.name, "fp16": settings.fp16}

    def submit(self, ids: list[int]) -> "DecodedBatch | Future":
        """The batch queued on the background thread (a Future), or decoded now; ``result()`` returns ``decode``'s
        answer, or raises its error."""
        if self._executor is None:
            return super().submit(ids)
        return self._executor.submit(self.decode, ids)

    def close(self) -> None:
        """Stop the background thread: batches not started are cancelled, the one being decoded is finished
        (a thread cannot be interrupted), so none is left running when the caller is done or stopped."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def decode(self, ids: list[int]) -> Decoded:
        sample = self.dataset.collater([self.dataset[i] for i in ids])
        if self.device != "cpu":
            from fairseq import utils
            sample = utils.move_to_cuda(sample, device=self.device)
        hypos = self.teacher.task.inference_step(self.generator, self.teacher.models, sample)
        kept = [nbest[: self.nbest] for nbest in hypos]
        pieces = iter(token_strings(self.teacher.tgt_dict, [h["tokens"].cpu() for nbest in kept for h in nbest]))
        return [(sentence_id, [Hypothesis(next(pieces), float(h["positional_scores"].float().mean())) for h in nbest])
                for sentence_id, nbest in zip(sample["id"].tolist(), kept)]
