"""fast_align's file formats, read and written exactly.

* input corpus: one pair a line, ``source tokens ||| target tokens``;
* alignments: Pharaoh ``i-j`` pairs (source index - target index, 0-based), one line per pair,
  an empty line when nothing is aligned;
* conditional probability table (``fast_align -p``): ``x<TAB>y<TAB>ln p(y|x)``, NULL written ``<eps>``,
  numbers as C++ ``ostream`` prints a double (6 significant digits, i.e. ``%.6g``).

Writers return text; callers write it with ``nat_kd.atomic`` so a crash never leaves a half-written file.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from nat_kd.corpus import CorpusError, iter_lines, read_lines

NULL_WORD = "<eps>"
SEPARATOR = "|||"


# ---------------------------------------------------------------- parallel text (`src ||| tgt`)

def check_pair(src: str, tgt: str, number: int, src_name: str, tgt_name: str) -> None:
    """Reject what fast_align would misread: an empty side, or a ``|||`` token inside a sentence."""
    for text, name in ((src, src_name), (tgt, tgt_name)):
        if not text.split():
            raise CorpusError(f"{name}:{number}: empty line; fast_align cannot align an empty sentence. "
                              "Remove this pair from both files (or pass --drop-empty).")
        if SEPARATOR in text.split():
            raise CorpusError(f"{name}:{number}: the token '|||' occurs inside the sentence; it is fast_align's "
                              "source/target separator. Replace it (e.g. with '| | |') before aligning.")


def format_parallel(src: list[str], tgt: list[str]) -> str:
    """fast_align's input text for line-aligned, tokenised sentences (checked beforehand)."""
    return "".join(f"{s} {SEPARATOR} {t}\n" for s, t in zip(src, tgt))


def iter_parallel_tokens(path: str | os.PathLike) -> Iterator[tuple[list[str], list[str]]]:
    """(source tokens, target tokens) of each line of a ``src ||| tgt`` file, split at the first ``|||`` token
    as fast_align does; read line by line, so a corpus of any size streams through."""
    for number, line in enumerate(iter_lines(path), 1):
        left, sep, right = line.partition(f" {SEPARATOR} ")
        if sep and SEPARATOR not in left and left.strip():  # the usual layout: split the two sides directly
            src, tgt = left.split(), right.split()
            if tgt:
                yield src, tgt
                continue
        tokens = line.split()
        try:
            cut = tokens.index(SEPARATOR)
        except ValueError:
            raise CorpusError(f"{path}:{number}: no ' ||| ' separator; each line must be 'source ||| target'") from None
        if cut == 0 or cut == len(tokens) - 1:
            raise CorpusError(f"{path}:{number}: empty source or target side; remove the line")
        yield tokens[:cut], tokens[cut + 1:]


# ---------------------------------------------------------------- Pharaoh alignments

@dataclass
class Alignments:
    """All links of a corpus as flat arrays: sentence number, source index, target index (0-based)."""

    sentence: np.ndarray
    source: np.ndarray
    target: np.ndarray
    num_sentences: int

    def links_of(self, n: int) -> list[tuple[int, int]]:
        mask = self.sentence == n
        return list(zip(self.source[mask].tolist(), self.target[mask].tolist()))


def format_alignments(al: Alignments) -> str:
    """Pharaoh text: per sentence, links in stored order (sentence numbers ascending), ``i-j`` joined by spaces."""
    if len(al.sentence) == 0:
        return "\n" * al.num_sentences
    # each link as a ready string with its separator, looked up from a small table of all "i-j" pairs
    width = int(max(al.source.max(), al.target.max())) + 1
    names = [str(k) for k in range(width)]
    pairs = np.array([f"{i}-{j}" for i in names for j in names], dtype=object)
    last = np.ones(len(al.sentence), dtype=bool)
    last[:-1] = al.sentence[1:] != al.sentence[:-1]
    pieces = pairs[al.source * width + al.target] + np.where(last, "\n", " ").astype(object)
    # sentences without links still get their (empty) line
    empty = np.setdiff1d(np.arange(al.num_sentences), al.sentence)
    keys = np.concatenate((al.sentence, empty))
    order = np.argsort(keys, kind="stable")
    return "".join(np.concatenate((pieces, np.full(len(empty), "\n", dtype=object)))[order].tolist())


def read_alignments(path: str | os.PathLike) -> Alignments:
    """Parse a Pharaoh file; malformed links name file and line."""
    sentence, source, target = [], [], []
    lines = read_lines(path)
    for number, line in enumerate(lines, 1):
        for link in line.split():
            i, dash, j = link.partition("-")
            if not dash or not i.isdigit() or not j.isdigit():
                raise CorpusError(f"{path}:{number}: malformed alignment link {link!r}; expected 'i-j' "
                                  "with 0-based source and target indices")
            sentence.append(number - 1)
            source.append(int(i))
            target.append(int(j))
    return Alignments(np.array(sentence, dtype=np.int64), np.array(source, dtype=np.int64),
                      np.array(target, dtype=np.int64), len(lines))


# ---------------------------------------------------------------- conditional probability tables

@dataclass
class TranslationTable:
    """Sparse p(y|x): parallel arrays of row word id, column word id and probability.

    Row 0 of ``rows`` may be the NULL word ``<eps>``; rows and columns have separate vocabularies.
    """

    rows: list[str]
    cols: list[str]
    row: np.ndarray
    col: np.ndarray
    prob: np.ndarray

    def pruned(self, beam_threshold: float) -> "TranslationTable":
        """Keep entries with ln p >= -ln(max_p) * beam_threshold, fast_align's ``-p`` export rule.

        With the default threshold -4 this keeps p >= max_p**4 within each row.
        """
        max_p = np.full(len(self.rows), -1.0)
        np.maximum.at(max_p, self.row, self.prob)
        with np.errstate(divide="ignore"):
            keep = np.log(self.prob) >= -np.log(max_p[self.row]) * beam_threshold
        return TranslationTable(self.rows, self.cols, self.row[keep], self.col[keep], self.prob[keep])

    def without_null(self) -> "TranslationTable":
        keep = np.array([w != NULL_WORD for w in self.rows])[self.row]
        return TranslationTable(self.rows, self.cols, self.row[keep], self.col[keep], self.prob[keep])

    def normalised(self) -> "TranslationTable":
        """Rows rescaled to sum to one (pruned and variational-Bayes rows do not), without the entries of
        probability 0 (ln p = -inf, or too small for a double): such an entry is a pair the row does not hold,
        as fast_align leaves out a pair it never saw, so it adds 0 log 0 = 0 to an entropy and is floored in
        F(d) like a missing pair. A row left with no entry drops out."""
        keep = self.prob > 0
        row, col, prob = self.row[keep], self.col[keep], self.prob[keep]
        totals = np.bincount(row, prob, minlength=len(self.rows))
        return TranslationTable(self.rows, self.cols, row, col, prob / totals[row])

    def present_rows(self) -> np.ndarray:
        """Ids of rows with at least one entry."""
        return np.flatnonzero(np.bincount(self.row, minlength=len(self.rows)))


def format_table(table: TranslationTable) -> str:
    """fast_align's ``-p`` text: rows in row order, entries in stored order, ln p as ``%.6g``."""
    order = np.argsort(table.row, kind="stable")
    rows = np.array(table.rows, dtype=object)[table.row[order]]
    cols = np.array(table.cols, dtype=object)[table.col[order]]
    with np.errstate(divide="ignore"):
        logp = np.char.mod("%.6g", np.log(table.prob[order]))
    return "".join(f"{a}\t{b}\t{c}\n" for a, b, c in zip(rows.tolist(), cols.tolist(), logp.tolist()))


def read_table(path: str | os.PathLike) -> TranslationTable:
    """Parse a ``-p`` table; a malformed line names file and line number."""
    row_ids: dict[str, int] = {}
    col_ids: dict[str, int] = {}
    row, col, logp = [], [], []
    for number, line in enumerate(read_lines(path), 1):
        fields = line.split("\t")
        if len(fields) != 3 or not fields[0] or not fields[1]:
            raise CorpusError(f"{path}:{number}: malformed table line {line[:60]!r}; expected "
                              "'source<TAB>target<TAB>log-probability' as written by fast_align -p")
        try:
            value = float(fields[2])
        except ValueError:
            raise CorpusError(f"{path}:{number}: {fields[2]!r} is not a number; the third column must be "
                              "ln p(target|source)") from None
        if value > 1e-6 or math.isnan(value):
            raise CorpusError(f"{path}:{number}: log-probability {fields[2]} > 0; the third column must be "
                              "a natural-log probability (<= 0)")
        row.append(row_ids.setdefault(fields[0], len(row_ids)))
        col.append(col_ids.setdefault(fields[1], len(col_ids)))
        logp.append(value)
    if not row:
        raise CorpusError(f"{path}: empty table; run the aligner with -p (conditional probabilities) first")
    table = TranslationTable(list(row_ids), list(col_ids), np.array(row, dtype=np.int64),
                             np.array(col, dtype=np.int64), np.exp(np.array(logp)))
    if set(table.rows) == {NULL_WORD}:
        raise CorpusError(f"{path}: the table has no row but {NULL_WORD} (NULL), so no source word to measure; "
                          "pass the whole table that fast_align -p wrote")
    # a row of probability-0 entries only holds no distribution to renormalise: named by its first line
    empty = np.bincount(table.row, table.prob > 0, minlength=len(table.rows)) == 0
    if empty.any():
        first_line = np.unique(table.row, return_index=True)[1]  # entry k is on line k + 1
        word = int(np.flatnonzero(empty)[0])
        raise CorpusError(f"{path}:{first_line[word] + 1}: every entry of {table.rows[word]!r} has probability 0 "
                          "(ln p -inf, or below about -745, where a double underflows), so its row holds no "
                          "distribution; give it one entry with a larger ln p, or remove its lines")
    return table
