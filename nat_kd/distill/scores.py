"""Corpus BLEU and chrF of a distilled set against its references, gathered chunk by chunk.

sacrebleu scores a corpus from per-sentence sufficient statistics (n-gram matches and totals, lengths),
summed (nat_kd.analysis.metrics.bleu). The decoding processes sum them for each chunk as it finishes, so the
merge only adds a few lists instead of scoring the whole corpus again on one core. The result is sacrebleu's
corpus_score exactly: the statistics are integers, and a test holds the two equal.
"""
from __future__ import annotations

from nat_kd.analysis.metrics.bleu import BleuStatistics, ChrfStatistics, summed
from nat_kd.analysis.metrics.sentence import length_ratio, sacrebleu_statistics

METRICS = ("bleu", "chrf")


def statistics(hypotheses: list[str], references: list[str], per_line: dict[str, list] | None = None) -> dict:
    """Summed sacrebleu statistics of BLEU and chrF (``per_line``: the lines' own, if already extracted)."""
    per_line = per_line or sacrebleu_statistics(hypotheses, references)
    out = {name: summed(per_line[name]) for name in METRICS}
    out["sentences"] = len(hypotheses)
    return out


def scores(parts: list[dict], hypotheses: list[str], references: list[str] | None) -> dict:
    """meta.json's scores from the chunks' ``statistics`` (in chunk order) and the whole texts."""
    if references is None:
        return {}
    if sum(part["sentences"] for part in parts) != len(hypotheses):
        raise AssertionError("score statistics do not cover every sentence; this is a bug")
    metrics = {"bleu": BleuStatistics(), "chrf": ChrfStatistics()}
    bleu, chrf = (metrics[name].score(summed(part[name] for part in parts)) for name in METRICS)
    ratios = [length_ratio(h, r) for h, r in zip(hypotheses, references)]
    return {"bleu": round(bleu.score, 4), "chrf": round(chrf.score, 4),
            "bleu_signature": metrics["bleu"].signature(), "chrf_signature": metrics["chrf"].signature(),
            # sacrebleu's sys_len / ref_len over the corpus, and the mean of per-sentence word-count ratios
            "length_ratio_corpus": round(bleu.sys_len / max(1, bleu.ref_len), 4),
            "mean_length_ratio": round(sum(ratios) / len(ratios), 4)}
