"""Decode chunks of the corpus with a teacher: fairseq's collater and SequenceGenerator, batch by batch."""
from __future__ import annotations

import time

from ..distill_corpus import token_strings
from ..distill_scores import statistics
from .base import DecodingStrategy


class ChunkDecoder:
    def __init__(self, teacher, strategy: DecodingStrategy, dataset, sp, references=None, device="cpu"):
        self.teacher, self.strategy, self.dataset = teacher, strategy, dataset
        self.references, self.sp, self.device = references, sp, device
        self.generator = strategy.build_generator(teacher.models, teacher.tgt_dict)
        if strategy.needs_reference and references is None:
            raise ValueError(f"{strategy.name} needs the references (--reference)")

    def decode_batch(self, ids: list[int]) -> list[tuple[int, str]]:
        """(sentence id, pieces of the kept hypothesis) for each sentence of one fairseq batch."""
        sample = self.dataset.collater([self.dataset[i] for i in ids])
        if self.device != "cpu":
            from fairseq import utils
            sample = utils.move_to_cuda(sample, device=self.device)
        hypos = self.teacher.task.inference_step(self.generator, self.teacher.models, sample)
        sentence_ids = sample["id"].tolist()
        if not self.strategy.needs_reference:
            return list(zip(sentence_ids, token_strings(self.teacher.tgt_dict, [nbest[0]["tokens"].cpu()
                                                                                for nbest in hypos])))
        out = []
        for sentence_id, nbest in zip(sentence_ids, hypos):
            candidates = token_strings(self.teacher.tgt_dict, [h["tokens"].cpu() for h in nbest])
            texts = self.sp.decode([c.split() for c in candidates])
            out.append((sentence_id, candidates[self.strategy.choose(texts, self.references[sentence_id])]))
        return out

    def decode_chunk(self, batches: list[list[int]]) -> dict:
        """The chunk's sentences in id order: pieces and text; with references, the chunk's summed BLEU/chrF
        statistics (nat_kd.distill_scores)."""
        start = time.perf_counter()
        results = sorted(pair for batch in batches for pair in self.decode_batch(batch))
        chunk = {"ids": [i for i, _ in results], "pieces": [p for _, p in results]}
        chunk["text"] = self.sp.decode([p.split() for p in chunk["pieces"]])
        if self.references is not None:
            chunk["statistics"] = statistics(chunk["text"], [self.references[i] for i in chunk["ids"]])
        chunk["seconds"] = round(time.perf_counter() - start, 3)
        return chunk
