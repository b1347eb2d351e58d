"""Faithfulness F(d) = (1/|Vx|) sum_x KL(p_real(.|x) || p_distilled(.|x)) (Zhou, Gu & Neubig, ICLR 2020).

Both tables are renormalised row by row and their NULL rows dropped. The sum runs over the real table's
source vocabulary. Smoothing floor (``floor``, default 1e-9, fast_align's own probability for an unseen
pair):

* x in both tables, y seen in the real row but missing from the distilled row: q(y|x) = floor, and the
  distilled row is rescaled by 1 / (1 + k * floor) (k such y) so it still sums to one: KL stays >= 0;
* x absent from the distilled table: q(y|x) = floor for every y of the real row, so that word costs
  ln(1/floor) - H(p_real(.|x)) (about 20.7 nats), reported as ``missing_words``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from nat_kd.analysis.formats import TranslationTable
from nat_kd.analysis.metrics.base import (CARD, CENTRAL, CORRELATION, DECODING, DETAILS, RANKING, REPORT, AlignedCorpus,
                                          Column, Measure, MeasuredSet, Signature, check_floor, log_base_divisor,
                                          pairs_in_memory, unit_name)
from nat_kd.errors import SettingsError

DEFAULT_FLOOR = 1e-9


def _lookup(keys: np.ndarray, table_keys: np.ndarray, table_values: np.ndarray) -> np.ndarray:
    """Value of each key in a (key -> value) table; NaN where absent."""
    order = np.argsort(table_keys)
    sorted_keys = table_keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, keys), max(len(sorted_keys) - 1, 0))
    found = (sorted_keys[pos] == keys) if len(sorted_keys) else np.zeros(len(keys), bool)
    return np.where(found, table_values[order][pos] if len(sorted_keys) else np.nan, np.nan)


def _tables_at_real_entries(real: TranslationTable, distilled: TranslationTable):
    """(p: the real table, renormalised without NULL; q(y|x) at each of p's entries, NaN where the distilled
    table lacks the pair; whether each of p's rows is in the distilled table)."""
    p = real.without_null().normalised()
    q = distilled.without_null().normalised()
    q_row_of = {w: i for i, w in enumerate(q.rows)}
    q_col_of = {w: i for i, w in enumerate(q.cols)}
    row_map = np.array([q_row_of.get(w, -1) for w in p.rows], dtype=np.int64)
    col_map = np.array([q_col_of.get(w, -1) for w in p.cols], dtype=np.int64)
    width = len(q.cols) + 1
    q_prob = _lookup(row_map[p.row] * width + col_map[p.col], q.row * width + q.col, q.prob)
    q_present = np.bincount(q.row, minlength=len(q.rows)) > 0
    row_in_q = np.zeros(len(p.rows), dtype=bool)
    row_in_q[row_map >= 0] = q_present[row_map[row_map >= 0]]
    return p, q_prob, row_in_q


def row_kl(real: TranslationTable, distilled: TranslationTable, floor: float = DEFAULT_FLOOR):
    """(real row ids, KL in nats of each, whether the word is missing from the distilled table)."""
    p, q_prob, row_in_q = _tables_at_real_entries(real, distilled)
    missing_entry = np.isnan(q_prob)
    k = np.bincount(p.row, missing_entry, minlength=len(p.rows))
    rescale = np.where(row_in_q, 1.0 + k * floor, 1.0)
    q_smoothed = np.where(missing_entry, floor, q_prob) / rescale[p.row]
    kl = np.bincount(p.row, p.prob * (np.log(p.prob) - np.log(q_smoothed)), minlength=len(p.rows))
    present = p.present_rows()
    return present, np.maximum(kl[present], 0.0), ~row_in_q[present]


@dataclass
class FaithfulnessScore:
    score: float
    vocab_size: int
    missing_words: int
    words: list[str]         # real source words, from least to most faithfully kept
    divergences: np.ndarray  # their KL, same order, in the score's unit
    signature: Signature

    def format(self) -> str:
        unit = unit_name(self.signature.settings.get("log", "e"))
        return (f"F(d) = {self.score:.4f} {unit} over |Vx| = {self.vocab_size} "
                f"({self.missing_words} words missing from the distilled table) | {self.signature}")


class Faithfulness:
    """F(d) of a distilled table against the real one."""

    def __init__(self, log_base: str = "e", floor: float = DEFAULT_FLOOR):
        check_floor(floor)
        self.log_base, self.floor = log_base, floor
        self.divisor = log_base_divisor(log_base)

    def table_score(self, real: TranslationTable, distilled: TranslationTable,
                    settings: dict | None = None) -> FaithfulnessScore:
        present, kl, missing = row_kl(real, distilled, self.floor)
        kl = kl / self.divisor
        order = np.argsort(-kl, kind="stable")
        words = [real.rows[r] for r in present[order]]
        signature = Signature("faithfulness", {**(settings or {}), "log": self.log_base, "floor": self.floor})
        return FaithfulnessScore(float(kl.mean()) if len(kl) else float("nan"), len(present), int(missing.sum()),
                                 words, kl[order], signature)

    def corpus_score(self, real: AlignedCorpus, distilled: AlignedCorpus) -> FaithfulnessScore:
        """F(d) of two aligned corpora, which must share tokeniser and aligner settings."""
        if real.settings != distilled.settings:
            raise SettingsError(f"not comparable: real data aligned with {real.settings} but distilled data with "
                             f"{distilled.settings}; use the same tokeniser and aligner options for both")
        return self.table_score(real.result.exported_table(), distilled.result.exported_table(), real.settings)


def missing_mass(real: TranslationTable, distilled: TranslationTable) -> float:
    """Mean over the real source words of the real translation probability on pairs the distilled table
    lacks: the mass that the floor prices at ln(1/floor) nats each, so F(d) grows by about this times
    ln(1/floor) as the floor falls."""
    p, q_prob, _ = _tables_at_real_entries(real, distilled)
    per_row = np.bincount(p.row, p.prob * np.isnan(q_prob), minlength=len(p.rows))
    present = p.present_rows()
    return float(per_row[present].mean()) if len(present) else float("nan")


class InterpolatedFaithfulness:
    """F(d) with the distilled rows interpolated with a unigram distribution instead of floored:
    KL(p(.|x) || (1 - lam) q(.|x) + lam u), u the add-one unigram of the distilled targets over the words of
    both data sets. An unseen pair then costs about ln(1 / (lam u(y))) instead of ln(1/floor) (20.7 nats at
    1e-9), and a word the teacher never writes still has mass: every term is finite without a floor."""

    def __init__(self, lam: float = 0.1, log_base: str = "e"):
        if not 0 < lam < 1:
            raise SettingsError("the interpolation weight must be in (0, 1)")
        self.lam, self.log_base = lam, log_base
        self.divisor = log_base_divisor(log_base)

    def table_score(self, real: TranslationTable, distilled: TranslationTable, target_counts: dict[str, int],
                    settings: dict | None = None) -> FaithfulnessScore:
        """``target_counts``: each target word's count in the distilled data's (tokenised) targets."""
        p, q_prob, row_in_q = _tables_at_real_entries(real, distilled)
        vocabulary = set(p.cols) | set(target_counts)
        total = sum(target_counts.values()) + len(vocabulary)
        unigram = np.array([(target_counts.get(w, 0) + 1) / total for w in p.cols])
        q_smoothed = (1 - self.lam) * np.nan_to_num(q_prob) + self.lam * unigram[p.col]
        kl = np.bincount(p.row, p.prob * (np.log(p.prob) - np.log(q_smoothed)), minlength=len(p.rows))
        present = p.present_rows()
        kl = np.maximum(kl[present], 0.0) / self.divisor
        order = np.argsort(-kl, kind="stable")
        signature = Signature("faithfulness", {**(settings or {}), "log": self.log_base,
                                               "smoothing": f"interpolate({self.lam},add-one-unigram)"})
        return FaithfulnessScore(float(kl.mean()) if len(kl) else float("nan"), len(present),
                                 int((~row_in_q[present]).sum()), [p.rows[r] for r in present[order]], kl[order],
                                 signature)


def floored_score(data: MeasuredSet) -> FaithfulnessScore:
    """The set's F(d) at the report's floor, for the measures that read it."""
    return Faithfulness(data.settings.log_base, data.settings.floor).table_score(data.real.table, data.table)


class FlooredFaithfulness(Measure):
    """F(d) as the paper defines it: the distilled rows floored where they lack a pair of the real ones."""

    name, label, format, relative = "faithfulness", "F(d)", ".4f", True
    tables = {REPORT: Column(), CARD: Column(), CENTRAL: Column("F(d) 1e-9", ".3f"),
              DECODING: Column("faithfulness F(d)"), CORRELATION: Column("F(d), floor 1e-9")}

    def corpus_score(self, data: MeasuredSet) -> float:
        return data.once(floored_score).score

    def signature_settings(self) -> dict:
        return {"log": self.settings.log_base, "floor": self.settings.floor}


class MissingWords(Measure):
    """The real source words absent from the set's table, each priced at the floor in F(d)."""

    name, label, relative = "missing_words", "words missing from the table", True

    def corpus_score(self, data: MeasuredSet) -> int:
        return data.once(floored_score).missing_words


class FaithfulnessByFloor(Measure):
    """F(d) at each of the detailed report's floors (floor -> F(d))."""

    name, label, relative, needs = "faithfulness_floors", "F(d) by floor", True, DETAILS

    def corpus_score(self, data: MeasuredSet) -> dict[str, float]:
        return {str(floor): Faithfulness(self.settings.log_base, floor).table_score(data.real.table, data.table).score
                for floor in self.settings.floors}


class MissingMass(Measure):
    """The real translation probability on pairs the set's table lacks (``missing_mass``)."""

    name, label, format, relative, needs = "missing_mass", "real mass missing", ".3f", True, DETAILS
    tables = {CORRELATION: Column()}

    def corpus_score(self, data: MeasuredSet) -> float:
        return missing_mass(data.real.table, data.table)


class UnigramFaithfulness(Measure):
    """F(d) with the distilled rows interpolated with the unigram of its targets (``InterpolatedFaithfulness``)."""

    name, label, format, relative, needs = "faithfulness_interpolated", "F(d) interp.", ".3f", True, DETAILS
    tables = {RANKING: Column(), CENTRAL: Column(), CORRELATION: Column("F(d), interpolated", before="missing_mass")}

    def corpus_score(self, data: MeasuredSet) -> float:
        target_counts = Counter(w for _, tgt in data.once(pairs_in_memory) for w in tgt)
        return InterpolatedFaithfulness(self.settings.interpolation, self.settings.log_base).table_score(
            data.real.table, data.table, target_counts).score
