"""Corpus BLEU and chrF of a distilled set against its references, gathered chunk by chunk.

sacrebleu scores a corpus from per-sentence sufficient statistics (n-gram matches and totals, lengths),
summed. The decoding processes sum them for each chunk as it finishes, so the merge only adds a few lists
instead of scoring the whole corpus again on one core.
The result is sacrebleu's corpus_score exactly: the statistics are integers, and the two steps are the ones
corpus_score runs (``_extract_corpus_statistics``, ``_aggregate_and_compute``; sacrebleu is pinned, and a
test holds the two equal).
"""
from __future__ import annotations

import sacrebleu
from sacrebleu.utils import sum_of_lists

from nat_kd.analysis.metrics.sentence import length_ratio, sacrebleu_statistics


def _metrics():
    return {"bleu": sacrebleu.BLEU(), "chrf": sacrebleu.CHRF()}


def statistics(hypotheses: list[str], references: list[str], per_line: dict[str, list] | None = None) -> dict:
    """Summed sacrebleu statistics of BLEU and chrF (``per_line``: the lines' own, if already extracted)."""
    per_line = per_line or sacrebleu_statistics(hypotheses, references)
    out = {name: [int(x) for x in sum_of_lists(per_line[name])] for name in _metrics()}
    out["sentences"] = len(hypotheses)
    return out


def scores(parts: list[dict], hypotheses: list[str], references: list[str] | None) -> dict:
    """meta.json's scores from the chunks' ``statistics`` (in chunk order) and the whole texts."""
    if references is None:
        return {}
    metrics = _metrics()
    for metric in metrics.values():  # one sentence through each metric records nrefs:1 for its signature
        metric._extract_corpus_statistics(hypotheses[:1], [references[:1]])
    bleu, chrf = (metrics[name]._aggregate_and_compute([part[name] for part in parts]) for name in ("bleu", "chrf"))
    if sum(part["sentences"] for part in parts) != len(hypotheses):
        raise AssertionError("score statistics do not cover every sentence; this is a bug")
    ratios = [length_ratio(h, r) for h, r in zip(hypotheses, references)]
    return {"bleu": round(bleu.score, 4), "chrf": round(chrf.score, 4),
            "bleu_signature": str(metrics["bleu"].get_signature()),
            "chrf_signature": str(metrics["chrf"].get_signature()),
            # sacrebleu's sys_len / ref_len over the corpus, and the mean of per-sentence word-count ratios
            "length_ratio_corpus": round(bleu.sys_len / max(1, bleu.ref_len), 4),
            "mean_length_ratio": round(sum(ratios) / len(ratios), 4)}
