"""fast_align (Dyer, Chahuneau & Smith 2013) in numpy: IBM Model 2 with a diagonal tension, trained by EM.

The model and its training follow fast_align's ``fast_align.cc`` / ``da.h`` / ``ttables.h``:

* iteration 1 starts from an uninitialised table (every t(y|x) = 1e-9, so only the alignment prior speaks);
* alignment prior with ``favor_diagonal``: p(NULL) = p_null, p(a_j = i) proportional to
  exp(-tension * |i/n - j/m|) (1-based i, j), normalised to 1 - p_null in closed form (``ComputeZ``);
  without it: uniform 1/(n+1) (1/n with ``no_null_word``);
* expected counts are accumulated for every iteration but the last, then the table is normalised
  (or, with variational Bayes, t = exp(digamma(c + alpha) - digamma(sum_y (c + alpha))) using fast_align's
  own digamma approximation);
* from the 2nd iteration on, and before normalising, ``optimize_tension`` makes 8 gradient steps
  tension += 20 * (empirical - model feature), clamped to [0.1, 14]; the empirical feature uses the
  0-based target index exactly as fast_align does;
* the last iteration only produces the Viterbi links (NULL wins ties; among source words the first max).

Everything touching all sentence positions is one flat numpy array over all (target token, source position)
links of the corpus, so each EM step is a few gathers, a ``reduceat`` and a ``bincount``.
"""
from __future__ import annotations

import collections
import itertools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nat_kd.alignment_io import (NULL_WORD, Alignments, TranslationTable, format_parallel, read_alignments,
                                 read_parallel_tokens, read_table)
from nat_kd.corpus import CorpusError

UNINITIALISED_PROB = 1e-9  # fast_align's t(y|x) before the first normalisation
CHUNK_LINKS = 1 << 20  # links per E-step piece: keeps temporaries to a few MB whatever the corpus size


@dataclass(frozen=True)
class AlignerOptions:
    """fast_align's command-line options, with its defaults (flag letters in comments)."""

    iterations: int = 5            # -I
    favor_diagonal: bool = False   # -d
    optimize_tension: bool = False  # -o
    variational_bayes: bool = False  # -v
    alpha: float = 0.01            # -a
    diagonal_tension: float = 4.0  # -T
    p_null: float = 0.08           # -q
    no_null_word: bool = False     # -N
    reverse: bool = False          # -r
    beam_threshold: float = -4.0   # -t, applies to the -p table export

    def __post_init__(self):
        if self.iterations < 1:
            raise ValueError("iterations must be >= 1")
        if self.variational_bayes and self.alpha <= 0:
            raise ValueError("--alpha must be > 0 with variational Bayes")
        if not 0 <= self.p_null < 1:
            raise ValueError("p_null must be in [0, 1)")

    def fast_align_args(self) -> list[str]:
        """The same settings as fast_align command-line flags."""
        args = ["-I", str(self.iterations), "-a", repr(self.alpha), "-q", repr(self.p_null),
                "-t", repr(self.beam_threshold)]
        if self.favor_diagonal:  # fast_align's -T also switches -d on, so pass it only with -d
            args += ["-T", repr(self.diagonal_tension)]
        for flag, on in (("-d", self.favor_diagonal), ("-o", self.optimize_tension),
                         ("-v", self.variational_bayes), ("-N", self.no_null_word), ("-r", self.reverse)):
            if on:
                args.append(flag)
        return args

    def signature(self) -> str:
        """Compact, sacrebleu-style description, e.g. ``I5|d|o|v|a0.01|T4.0|q0.08|t-4.0``."""
        flags = [f"I{self.iterations}"] + [name for name, on in (
            ("d", self.favor_diagonal), ("o", self.optimize_tension), ("v", self.variational_bayes),
            ("N", self.no_null_word), ("r", self.reverse)) if on]
        return "|".join(flags + [f"a{self.alpha}", f"T{self.diagonal_tension}", f"q{self.p_null}",
                                 f"t{self.beam_threshold}"])


#: The settings fast_align's README marks "[USE]"; nat-kd's default.
RECOMMENDED = AlignerOptions(favor_diagonal=True, optimize_tension=True, variational_bayes=True)


@dataclass
class EncodedSide:
    """One side of a corpus as integer ids: flat token ids plus per-sentence lengths."""

    vocab: list[str]
    ids: np.ndarray
    lengths: np.ndarray

    @classmethod
    def from_lines(cls, lines: list[str]) -> "EncodedSide":
        """Whitespace-split tokens; vocabulary in order of first appearance (as fast_align's Dict)."""
        return cls.from_token_lists([line.split() for line in lines])

    @classmethod
    def from_token_lists(cls, token_lists: list[list[str]]) -> "EncodedSide":
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        # one C-level pass: an unseen word gets the next id from the counter
        index = collections.defaultdict(itertools.count().__next__)
        ids = np.fromiter(map(index.__getitem__, itertools.chain.from_iterable(token_lists)), dtype=np.int64,
                          count=int(lengths.sum()))
        return cls(list(index), ids, lengths)


@dataclass
class AlignmentResult:
    """What a fast_align run yields: Viterbi links, the (unpruned) table, and the training trace."""

    alignments: Alignments
    table: TranslationTable | None
    options: AlignerOptions
    final_tension: float
    log_likelihoods: list[float] = field(default_factory=list)

    def exported_table(self) -> TranslationTable:
        """The table as ``fast_align -p`` writes it: pruned with the beam threshold."""
        if self.table is None:
            raise CorpusError("no probability table: fast_align normalises only between iterations, "
                              "so use at least 2 iterations (-I 2)")
        return self.table.pruned(self.options.beam_threshold)


# ------------------------------------------------------------------ diagonal alignment prior (da.h)

def _feature(trg_pos, src_pos, m, n):
    return -np.abs(src_pos / n - trg_pos / m)


def _compute_z(j1, m, n, tension):
    """Sum over source positions 1..n of exp(tension * feature), in closed form (two geometric series)."""
    split = j1 * n / m
    floor = np.floor(split).astype(np.int64)
    ceil = floor + 1
    ratio = np.exp(-tension / n)
    num_top = n - floor
    ezt = np.where(num_top > 0, np.exp(_feature(j1, ceil, m, n) * tension)
                   * (1.0 - ratio ** num_top) / (1.0 - ratio), 0.0)
    ezb = np.where(floor > 0, np.exp(_feature(j1, floor, m, n) * tension)
                   * (1.0 - ratio ** floor) / (1.0 - ratio), 0.0)
    return ezb + ezt


def _arith_geom_series(a_1, g_1, r, d, count):
    g_np1 = g_1 * r ** count
    a_n = d * (count - 1) + a_1
    rm1 = r - 1
    return (a_n * g_np1 - a_1 * g_1) / rm1 - d * (g_np1 - g_1 * r) / (rm1 * rm1)


def _compute_dlogz(j1, m, n, tension):
    """d log Z / d tension: the model's expected feature at target position j1."""
    z = _compute_z(j1, m, n, tension)
    floor = np.floor(j1 * n / m).astype(np.int64)
    ceil = floor + 1
    ratio = np.exp(-tension / n)
    d = -1.0 / n
    num_top = n - floor
    pct = np.where(num_top > 0, _arith_geom_series(_feature(j1, ceil, m, n),
                                                   np.exp(_feature(j1, ceil, m, n) * tension), ratio, d, num_top), 0.0)
    pcb = np.where(floor > 0, _arith_geom_series(_feature(j1, floor, m, n),
                                                 np.exp(_feature(j1, floor, m, n) * tension), ratio, d, floor), 0.0)
    return (pct + pcb) / z


def digamma(x: np.ndarray) -> np.ndarray:
    """fast_align's digamma: recurrence up to x >= 7, then the asymptotic series."""
    x = np.array(x, dtype=np.float64)  # a copy: shifted in place below
    result = np.zeros_like(x)
    # most values (small expected counts + alpha) are below 1 and take all 7 steps: do those unmasked
    below_one = np.flatnonzero(x < 1)
    shifted, acc = x[below_one], np.zeros(len(below_one))
    for _ in range(7):
        acc -= 1.0 / shifted
        shifted += 1.0
    x[below_one], result[below_one] = shifted, acc
    small = x < 7
    while small.any():  # the rest, from 1 up to 7, in at most 6 masked steps
        np.subtract(result, 1.0 / x, out=result, where=small)
        np.add(x, 1.0, out=x, where=small)
        np.less(x, 7, out=small)
    x = x - 0.5
    xx = 1.0 / x
    xx2 = xx * xx
    xx4 = xx2 * xx2
    return (result + np.log(x) + (1.0 / 24.0) * xx2 - (7.0 / 960.0) * xx4
            + (31.0 / 8064.0) * xx4 * xx2 - (127.0 / 30720.0) * xx4 * xx4)


# ------------------------------------------------------------------ the model

class FastAlign:
    """Train fast_align's model on a tokenised parallel corpus and return links and table."""

    def __init__(self, options: AlignerOptions = RECOMMENDED):
        self.options = options

    def align_lines(self, src: list[str], tgt: list[str]) -> AlignmentResult:
        """Align whitespace-tokenised, line-aligned sentences (each side non-empty)."""
        return self.align(EncodedSide.from_lines(src), EncodedSide.from_lines(tgt))

    def align_file(self, path: str | os.PathLike) -> AlignmentResult:
        """Align a fast_align input file (``src ||| tgt``, tokenised), like ``fast_align -i path``."""
        src, tgt = read_parallel_tokens(path)
        encoded = EncodedSide.from_token_lists(src), EncodedSide.from_token_lists(tgt)
        del src, tgt  # the token strings are no longer needed: free them before training
        return self.align(*encoded)

    def align(self, src: EncodedSide, tgt: EncodedSide) -> AlignmentResult:
        opt = self.options
        if len(src.lengths) != len(tgt.lengths):
            raise CorpusError(f"{len(src.lengths)} source but {len(tgt.lengths)} target sentences")
        if len(src.lengths) == 0:
            raise CorpusError("empty corpus: nothing to align")
        if (src.lengths == 0).any() or (tgt.lengths == 0).any():
            bad = int(np.flatnonzero((src.lengths == 0) | (tgt.lengths == 0))[0]) + 1
            raise CorpusError(f"line {bad}: empty sentence; fast_align cannot align it. Remove the pair.")
        if opt.reverse:
            src, tgt = tgt, src
        links = _Links(src, tgt)
        use_null = not opt.no_null_word
        tension = opt.diagonal_tension
        p_not_null = 1.0 - opt.p_null
        t = None
        log_likelihoods = []
        for iteration in range(opt.iterations):
            final = iteration == opt.iterations - 1
            want_feature = opt.favor_diagonal and opt.optimize_tension and iteration > 0 and not final
            prior_block = links.prior_block(tension, p_not_null) if opt.favor_diagonal else None
            counts = np.zeros(links.num_entries)
            emp_feat, likelihood, found = 0.0, 0.0, []
            for tokens, span in links.chunks():
                part = self._chunk_pass(links, t, prior_block, tokens, span, final, want_feature)
                likelihood += part[0]
                if final:
                    found.append(part[1])
                else:
                    counts += part[1]
                    emp_feat += part[2]
            log_likelihoods.append(likelihood)
            if final:
                alignments = links.alignments(found, opt.reverse)
                break
            if want_feature:
                tension = links.optimise_tension(tension, emp_feat / links.num_tokens)
            t = self._normalise(counts, links.entry_row, links.num_rows)
        table = None
        if t is not None:
            table = TranslationTable(links.row_words(), tgt.vocab, links.entry_row, links.entry_col, t)
            if not use_null:
                table = table.without_null()
        return AlignmentResult(alignments, table, opt, tension, log_likelihoods)

    def _chunk_pass(self, links, t, prior_block, tokens: slice, span: slice, final: bool, want_feature: bool):
        """E-step (or, when ``final``, Viterbi) over one chunk: (log-likelihood, counts or links, feature)."""
        opt = self.options
        use_null = not opt.no_null_word
        # p(a_j = i) t(y_j | x_i) for every link of the chunk, and for NULL
        if opt.favor_diagonal:
            probs = np.take(prior_block, links.prior_index[span])
            null_prior = opt.p_null
        else:
            null_prior = 1.0 / (links.n_of_token[tokens] + use_null)
            probs = np.repeat(null_prior, links.n_of_token[tokens])
        probs *= UNINITIALISED_PROB if t is None else np.take(t, links.pair[span])
        sums = np.add.reduceat(probs, links.start[tokens] - span.start)
        null_probs = None
        if use_null:
            null_probs = null_prior * (UNINITIALISED_PROB if t is None else t[links.null_pair[tokens]])
            sums += null_probs
        likelihood = float(np.log(sums).sum())
        if final:
            return likelihood, links.viterbi(probs, null_probs, tokens, span), 0.0
        inv = 1.0 / sums
        probs *= np.repeat(inv, links.n_of_token[tokens])  # now posteriors
        counts = np.bincount(links.pair[span], probs, minlength=links.num_entries)
        if use_null:
            counts += np.bincount(links.null_pair[tokens], null_probs * inv, minlength=links.num_entries)
        feature = float(np.dot(probs, np.take(links.feature0_block(), links.prior_index[span]))) if want_feature else 0.0
        return likelihood, counts, feature

    def _normalise(self, counts, row, num_rows):
        if self.options.variational_bayes:
            alpha = self.options.alpha
            totals = np.bincount(row, counts + alpha, minlength=num_rows)
            totals[totals == 0] = 1.0
            return np.exp(digamma(counts + alpha) - digamma(totals)[row])
        totals = np.bincount(row, counts, minlength=num_rows)
        totals[totals == 0] = 1.0
        return counts / totals[row]


class _Links:
    """Flat index arrays over every (target token, source position) pair of the corpus.

    Links are ordered by sentence, then target position, then source position, so the links of one
    target token are contiguous (``start``/``n_of_token``). Table entries are the co-occurring
    (source word, target word) pairs followed by one (NULL, target word) entry per target word.
    """

    def __init__(self, src: EncodedSide, tgt: EncodedSide):
        n, m = src.lengths, tgt.lengths
        self.num_sentences = len(n)
        self.num_tokens = int(m.sum())
        self.src_vocab, self.tgt_vocab = src.vocab, tgt.vocab
        src_start = np.concatenate(([0], np.cumsum(n)[:-1]))
        tgt_start = np.concatenate(([0], np.cumsum(m)[:-1]))
        self.token_sentence = np.repeat(np.arange(len(n)), m)
        self.token_j = np.arange(self.num_tokens) - np.repeat(tgt_start, m)
        self.n_of_token = n[self.token_sentence]
        self.start = np.concatenate(([0], np.cumsum(self.n_of_token)[:-1]))
        self.num_links = int(self.n_of_token.sum())
        # prior blocks: one m x n block per distinct sentence shape (fast_align's "size counts")
        width = int(n.max()) + 1
        shapes, shape_of_sentence, self.shape_count = np.unique(m * width + n, return_inverse=True,
                                                               return_counts=True)
        self.shape_m, self.shape_n = shapes // width, shapes % width
        sizes = self.shape_m * self.shape_n
        offset = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        local = np.arange(int(sizes.sum())) - np.repeat(offset, sizes)
        block_n = np.repeat(self.shape_n, sizes)
        self.block_m = np.repeat(self.shape_m, sizes).astype(np.float64)
        self.block_n = block_n.astype(np.float64)
        self.block_j1 = (local // block_n + 1).astype(np.float64)
        self.block_i1 = (local % block_n + 1).astype(np.float64)
        # per link, built a chunk at a time so no corpus-sized temporaries pile up: its cell in the prior
        # blocks, and (below) its (source word, target word) table entry
        token_block = offset[shape_of_sentence][self.token_sentence] + self.token_j * self.n_of_token
        self.prior_index = np.empty(self.num_links, dtype=np.int32)
        for tokens, span in self.chunks():
            self.prior_index[span] = np.repeat(token_block[tokens], self.n_of_token[tokens]) + self._source_position(
                tokens, span)
        unique_keys, self.pair = self._pair_ids(src.ids, src_start, tgt.ids, len(tgt.vocab))
        num_pairs = len(unique_keys)
        self.null_pair = num_pairs + tgt.ids
        self.num_entries = num_pairs + len(tgt.vocab)
        # row 0 is NULL, row r > 0 is source word r - 1
        self.entry_row = np.concatenate((unique_keys // len(tgt.vocab) + 1, np.zeros(len(tgt.vocab), np.int64)))
        self.entry_col = np.concatenate((unique_keys % len(tgt.vocab), np.arange(len(tgt.vocab))))
        self.num_rows = len(src.vocab) + 1

    def _source_position(self, tokens: slice, span: slice) -> np.ndarray:
        """0-based source position of each link in a chunk."""
        return np.arange(span.start, span.stop) - np.repeat(self.start[tokens], self.n_of_token[tokens])

    def _pair_ids(self, src_ids, src_start, tgt_ids, tgt_vocab_size):
        """Distinct keys (source word * |Vy| + target word), sorted, and each link's index into them.

        Each key is packed with its link number into one int64 and sorted in place: one plain sort and one
        scatter, about half the time and memory of ``np.unique(return_inverse=True)``.
        """
        key = np.empty(self.num_links, dtype=np.int64)
        token_src_start = src_start[self.token_sentence]
        for tokens, span in self.chunks():
            lengths = self.n_of_token[tokens]
            src_word = np.take(src_ids, np.repeat(token_src_start[tokens], lengths) + self._source_position(tokens, span))
            key[span] = src_word * tgt_vocab_size + np.repeat(tgt_ids[tokens], lengths)
        index_bits = max(self.num_links - 1, 1).bit_length()
        if int(key.max()).bit_length() + index_bits > 62:  # too big to pack: the plain way
            unique_keys, pair = np.unique(key, return_inverse=True)
            return unique_keys, pair.astype(np.int32)
        key <<= index_bits
        for tokens, span in self.chunks():
            key[span] |= np.arange(span.start, span.stop, dtype=np.int64)
        key.sort()
        order = key.astype(np.int32)  # the low 32 bits hold the link number
        order &= (1 << index_bits) - 1
        key >>= index_bits
        new = np.empty(self.num_links, dtype=bool)
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        unique_keys = key[new]
        del key
        ids = np.cumsum(new, dtype=np.int32)
        ids -= 1
        pair = np.empty(self.num_links, dtype=np.int32)
        pair[order] = ids
        return unique_keys, pair

    def row_words(self) -> list[str]:
        return [NULL_WORD] + self.src_vocab

    def prior_block(self, tension: float, p_not_null: float) -> np.ndarray:
        az = _compute_z(self.block_j1, self.block_m, self.block_n, tension) / p_not_null
        return np.exp(_feature(self.block_j1, self.block_i1, self.block_m, self.block_n) * tension) / az

    def feature0_block(self) -> np.ndarray:
        # fast_align's empirical feature uses the 0-based target index j (not j + 1)
        return _feature(self.block_j1 - 1, self.block_i1, self.block_m, self.block_n)

    def optimise_tension(self, tension: float, emp_feat: float) -> float:
        sizes = self.shape_m
        j1 = (np.arange(int(sizes.sum())) - np.repeat(np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes) + 1)
        m = np.repeat(self.shape_m, sizes).astype(np.float64)
        n = np.repeat(self.shape_n, sizes).astype(np.float64)
        weight = np.repeat(self.shape_count, sizes)
        for _ in range(8):
            mod_feat = float(np.dot(weight, _compute_dlogz(j1.astype(np.float64), m, n, tension))) / self.num_tokens
            tension += (emp_feat - mod_feat) * 20.0
            tension = 0.1 if tension <= 0.1 else min(tension, 14.0)
        return tension

    def chunks(self):
        """(token slice, link slice) pieces of about CHUNK_LINKS links: bounded temporaries, cache-sized work."""
        ends = np.searchsorted(self.start, np.arange(CHUNK_LINKS, self.num_links, CHUNK_LINKS))
        bounds = np.unique(np.concatenate(([0], ends, [self.num_tokens])))
        link_bounds = np.append(self.start, self.num_links)
        for t0, t1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            yield slice(t0, t1), slice(int(link_bounds[t0]), int(link_bounds[t1]))

    def viterbi(self, probs, null_probs, tokens: slice, span: slice):
        """Best link of each target token in a chunk: (token ids, source positions); NULL-aligned left out."""
        lengths = self.n_of_token[tokens]
        starts = self.start[tokens] - span.start
        best = np.maximum.reduceat(probs, starts)
        where = np.flatnonzero(probs == np.repeat(best, lengths))
        token = np.searchsorted(starts, where, side="right") - 1
        first = np.concatenate(([True], token[1:] != token[:-1]))  # the first maximum wins, as in fast_align
        where, token = where[first], token[first]
        if null_probs is not None:  # NULL is looked at first, so a source word must beat it strictly
            keep = best[token] > null_probs[token]
            where, token = where[keep], token[keep]
        return token + tokens.start, where - starts[token]

    def alignments(self, found, reverse: bool) -> Alignments:
        token = np.concatenate([f[0] for f in found])
        i = np.concatenate([f[1] for f in found])
        j = self.token_j[token]
        source, target = (j, i) if reverse else (i, j)
        return Alignments(self.token_sentence[token], source, target, self.num_sentences)


# ------------------------------------------------------------------ the real binary, for comparison

def run_fast_align_binary(src: list[str], tgt: list[str], options: AlignerOptions,
                          executable: str = "fast_align") -> AlignmentResult:
    """Run a ``fast_align`` executable on the same sentences and read back its links and ``-p`` table."""
    path = shutil.which(executable)
    if path is None:
        raise CorpusError(f"no '{executable}' executable on PATH; install fast_align "
                          "(https://github.com/clab/fast_align) or use --aligner builtin")
    with tempfile.TemporaryDirectory(prefix="nat_kd_fa_") as tmp:
        corpus = Path(tmp) / "corpus.src-tgt"
        table = Path(tmp) / "table.txt"
        corpus.write_text(format_parallel(src, tgt), encoding="utf-8")
        command = [path, "-i", str(corpus), *options.fast_align_args(), "-p", str(table)]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
        if done.returncode != 0:
            raise CorpusError(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr[-500:]}")
        links_file = Path(tmp) / "links.txt"
        links_file.write_text(done.stdout, encoding="utf-8")
        alignments = read_alignments(links_file)
        if alignments.num_sentences != len(src):
            raise CorpusError(f"fast_align wrote {alignments.num_sentences} alignment lines for {len(src)} pairs")
        ttable = read_table(table) if table.exists() and table.stat().st_size else None
    # the table file is already pruned; pruning again with the same threshold keeps it as it is
    return AlignmentResult(alignments, ttable, options, float("nan"))
