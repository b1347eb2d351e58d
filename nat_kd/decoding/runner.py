"""Decode chunks of the corpus with a teacher: fairseq's collater and SequenceGenerator, batch by batch."""
from __future__ import annotations

import time

import torch

from .base import DecodingStrategy


class ChunkDecoder:
    def __init__(self, teacher, strategy: DecodingStrategy, dataset, references=None, sp=None, device="cpu"):
        self.teacher, self.strategy, self.dataset = teacher, strategy, dataset
        self.references, self.sp, self.device = references, sp, device
        self.generator = strategy.build_generator(teacher.models, teacher.tgt_dict)
        if strategy.needs_reference and (references is None or sp is None):
            raise ValueError(f"{strategy.name} needs the references (--reference) and the sentencepiece model")

    def _pieces(self, tokens: torch.Tensor) -> str:
        return self.teacher.tgt_dict.string(tokens)

    def decode_batch(self, ids: list[int]) -> list[tuple[int, str]]:
        sample = self.dataset.collater([self.dataset[i] for i in ids])
        if self.device != "cpu":
            from fairseq import utils
            sample = utils.move_to_cuda(sample, device=self.device)
        hypos = self.teacher.task.inference_step(self.generator, self.teacher.models, sample)
        out = []
        for sentence_id, nbest in zip(sample["id"].tolist(), hypos):
            if self.strategy.needs_reference:
                candidates = [self._pieces(h["tokens"]) for h in nbest]
                texts = self.sp.decode([c.split() for c in candidates])
                chosen = candidates[self.strategy.choose(texts, self.references[sentence_id])]
            else:
                chosen = self._pieces(nbest[0]["tokens"])
            out.append((sentence_id, chosen))
        return out

    def decode_chunk(self, batches: list[list[int]]) -> dict:
        start = time.perf_counter()
        results = [pair for batch in batches for pair in self.decode_batch(batch)]
        results.sort()
        return {"ids": [i for i, _ in results], "pieces": [p for _, p in results],
                "seconds": round(time.perf_counter() - start, 3)}
