"""Decoding one chunk of the corpus: its batches submitted to the backend, one hypothesis kept per sentence (the
strategy's rule), detokenized and scored against the references."""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from nat_kd.analysis.metrics.sentence import SentenceScorer, sacrebleu_statistics
from nat_kd.errors import SettingsError

from .backends import Decoder, build_backend
from .scores import statistics

if TYPE_CHECKING:
    from .loaded import LoadedRun


class ChunkDecoder:
    """Decodes chunks of the corpus batch by batch with the loaded run's backend (or ``backend``, another decoder),
    keeps one hypothesis per sentence (the strategy's rule) and detokenizes. Empty sources are not decoded: their
    target is empty."""

    def __init__(self, loaded: LoadedRun, threads: int = 1, backend: Decoder | None = None):
        self.strategy, self.references = loaded.strategy, loaded.corpus.references
        self.codec = loaded.codecs[1]
        if self.strategy.needs_reference and self.references is None:
            raise SettingsError(f"{self.strategy.name} needs the references (--reference)")
        self.empty = {line - 1 for line in loaded.corpus.empty_lines}
        self.backend = backend or build_backend(loaded.backend_settings, loaded.backend_inputs, threads)
        self.scorer = SentenceScorer()
        self._last_finish = 0.0

    def decode_batch(self, ids: list[int]) -> list[tuple[int, str, float]]:
        """(sentence id, pieces of the kept hypothesis, its length-normalised log-probability: the backend's
        ``Hypothesis.logprob``) for each sentence of one batch; an empty source gets an empty target and a NaN
        log-probability (nothing was decoded)."""
        return self._finish_batch(self._submit_batch(ids))

    def _submit_batch(self, ids: list[int]):
        empty = [(i, "", math.nan) for i in ids if i in self.empty]
        decoding = [i for i in ids if i not in self.empty]
        return empty, (self.backend.submit(decoding) if decoding else None)

    def _finish_batch(self, pending) -> list[tuple[int, str, float]]:
        out, decoding = pending
        for sentence_id, nbest in (decoding.result() if decoding else []):
            best = nbest[0]
            if self.strategy.needs_reference:
                texts = self.codec.decode_all([h.pieces for h in nbest])
                best = nbest[self.strategy.choose(texts, self.references[sentence_id])]
            out.append((sentence_id, best.pieces, best.logprob))
        return out

    def decode_chunk(self, batches: list[list[int]]) -> dict:
        """The chunk's sentences in id order: pieces, text and log-probability; with references, the chunk's
        summed BLEU/chrF statistics (see scores); and each line's scores (nat_kd.analysis.metrics.sentence)."""
        return self.finish_chunk(self.submit_chunk(batches))

    def submit_chunk(self, batches: list[list[int]]):
        """Queue the chunk's batches on the backend; ``finish_chunk`` waits for them and builds the chunk."""
        return time.perf_counter(), [self._submit_batch(batch) for batch in batches]

    def finish_chunk(self, pending) -> dict:
        """The chunk (see decode_chunk). Its ``seconds`` run from its submission or the previous chunk's
        finish, whichever came later, so that the chunks' seconds add up to the decoding's wall time."""
        submitted, batches = pending
        start = max(submitted, self._last_finish)
        results = sorted(row for batch in batches for row in self._finish_batch(batch))
        chunk = {"ids": [i for i, _, _ in results], "pieces": [p for _, p, _ in results]}
        chunk["text"] = self.codec.decode_all(chunk["pieces"])
        references, per_line = None, None
        if self.references is not None:
            references = [self.references[i] for i in chunk["ids"]]
            per_line = sacrebleu_statistics(chunk["text"], references)
            chunk["statistics"] = statistics(chunk["text"], references, per_line)
        scores = self.scorer.score(chunk["text"], references, per_line, [lp for _, _, lp in results])
        chunk["scores"] = {name: values.tolist() for name, values in scores.columns.items()}
        self._last_finish = time.perf_counter()
        chunk["seconds"] = round(self._last_finish - start, 3)
        return chunk

    def close(self) -> None:
        """Stop the backend's own threads, if it has any (the fairseq backend's, on a GPU)."""
        self.backend.close()
