"""``--check-against-fairseq N`` and ``--check-against-transformers N``: decode N sentences with the configured
backend and with a reference decoder (the fairseq backend; transformers' own generate for a Hugging Face
teacher), and measure how far they agree: identical hypotheses and BLEU against the references."""
from __future__ import annotations

import logging
from dataclasses import replace

from .backends import Backend, backend_class
from .chunk_decoder import ChunkDecoder
from .loaded import LoadedRun
from .transformers_reference import TransformersReference

logger = logging.getLogger("nat_kd.generate_distilled")
BATCH_SENTENCES = 100
# an identical share below this: the two do not decode the same model (rounding, float16 or int8 change some
# hypotheses, not nearly all), and the warning names the usual causes
LOW_AGREEMENT = 0.2


def sample_batches(loaded: LoadedRun, count: int) -> list[list[int]]:
    """``count`` sentences spread evenly over the corpus in length order (short to long), non-empty, in batches
    of consecutive lengths."""
    ordered = [i for batch in loaded.batches() for i in batch if i + 1 not in loaded.corpus.empty_lines]
    step = max(1, len(ordered) // max(1, count))
    picked = ordered[::step][:count]
    return [picked[start:start + BATCH_SENTENCES] for start in range(0, len(picked), BATCH_SENTENCES)]


def check_references(loaded: LoadedRun) -> None:
    """Refuse a check the run cannot make, before anything is decoded."""
    if loaded.cfg.check_against_transformers:
        TransformersReference.check(loaded.backend_settings, loaded.teacher)


def check_against(loaded: LoadedRun, reference: str, count: int, threads: int) -> dict:
    """The agreement of the configured backend with ``reference`` ("fairseq" or "transformers") on ``count``
    sentences: meta.json's ``check_against_REFERENCE``."""
    import sacrebleu

    batches = sample_batches(loaded, count)
    reference_class = TransformersReference if reference == "transformers" else backend_class(reference)
    if loaded.device != "cpu" and issubclass(reference_class, Backend) and reference_class.pytorch_teacher:
        loaded.teacher.to(loaded.device)  # the run's own backend left it on the CPU
    backend = reference_class(replace(loaded.backend_settings, name=reference), loaded.backend_inputs, threads)
    ours = loaded.cfg.backend
    decoders = {reference: ChunkDecoder(loaded, threads, backend), ours: ChunkDecoder(loaded, threads)}
    try:
        pieces = {name: dict((i, p) for batch in batches for i, p, _ in decoder.decode_batch(batch))
                  for name, decoder in decoders.items()}
    finally:
        for decoder in decoders.values():
            decoder.close()
    ids = sorted(pieces[reference])
    theirs, mine = ([pieces[name][i] for i in ids] for name in (reference, ours))
    identical = sum(a == b for a, b in zip(theirs, mine))
    result = {"sentences": len(ids), "identical": identical, "identical_share": round(identical / max(1, len(ids)), 4)}
    references = loaded.corpus.references
    if references is not None:
        refs = [references[i] for i in ids]
        bleu = {name: sacrebleu.corpus_bleu(loaded.codecs[1].decode_all(hyps), [refs]).score
                for name, hyps in ((reference, theirs), (ours, mine))}
        result.update({f"bleu_{reference}": round(bleu[reference], 4), f"bleu_{ours}": round(bleu[ours], 4),
                       "bleu_difference": round(bleu[ours] - bleu[reference], 4)})
    logger.info("check against %s on %d sentences: %d identical (%.2f%%)%s", reference, len(ids), identical,
                100 * result["identical_share"],
                f", BLEU {result['bleu_difference']:+.2f} against {reference}" if "bleu_difference" in result else "")
    if reference == "transformers" and result["identical_share"] < LOW_AGREEMENT:
        logger.warning("only %d of %d hypotheses are identical to transformers' own: the two do not decode the same "
                       "model. The usual causes: %s", identical, len(ids), "; ".join(backend.disagreement_causes(
                           loaded.teacher)))
    return result
