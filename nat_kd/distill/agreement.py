"""``--check-against-fairseq N``: decode N sentences with the configured backend and with the fairseq backend
(the reference), and measure how far they agree: identical hypotheses and BLEU against the references."""
from __future__ import annotations

import logging
from dataclasses import replace

from .backends.fairseq import FairseqBackend
from .workers import ChunkDecoder, Session

logger = logging.getLogger("nat_kd.generate_distilled")
BATCH_SENTENCES = 100


def sample_batches(session: Session, count: int) -> list[list[int]]:
    """``count`` sentences spread evenly over the corpus in length order (short to long), non-empty, in batches
    of consecutive lengths."""
    ordered = [i for batch in session.batches() for i in batch if i + 1 not in session.corpus.empty_lines]
    step = max(1, len(ordered) // max(1, count))
    picked = ordered[::step][:count]
    return [picked[start:start + BATCH_SENTENCES] for start in range(0, len(picked), BATCH_SENTENCES)]


def check_against_fairseq(session: Session, count: int, threads: int) -> dict:
    import sacrebleu

    batches = sample_batches(session, count)
    if session.device != "cpu":
        session.teacher.to(session.device)
    reference = FairseqBackend(replace(session.backend_settings, name=FairseqBackend.name), session.backend_inputs)
    decoders = {"fairseq": ChunkDecoder(session, threads, reference),
                session.cfg.backend: ChunkDecoder(session, threads)}
    pieces = {name: dict((i, p) for batch in batches for i, p, _ in decoder.decode_batch(batch))
              for name, decoder in decoders.items()}
    ids = sorted(pieces["fairseq"])
    theirs, ours = ([pieces[name][i] for i in ids] for name in ("fairseq", session.cfg.backend))
    identical = sum(a == b for a, b in zip(theirs, ours))
    result = {"sentences": len(ids), "identical": identical, "identical_share": round(identical / max(1, len(ids)), 4)}
    references = session.corpus.references
    if references is not None:
        refs = [references[i] for i in ids]
        bleu = {name: sacrebleu.corpus_bleu(session.codecs[1].decode_all(hyps), [refs]).score
                for name, hyps in (("fairseq", theirs), (session.cfg.backend, ours))}
        result.update({"bleu_fairseq": round(bleu["fairseq"], 4), f"bleu_{session.cfg.backend}":
                       round(bleu[session.cfg.backend], 4),
                       "bleu_difference": round(bleu[session.cfg.backend] - bleu["fairseq"], 4)})
    logger.info("check against the fairseq backend on %d sentences: %d identical (%.2f%%)%s", len(ids), identical,
                100 * result["identical_share"],
                f", BLEU {result['bleu_difference']:+.2f} vs fairseq's" if "bleu_difference" in result else "")
    return result
