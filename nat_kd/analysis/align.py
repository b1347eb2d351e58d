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
import functools
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nat_kd.analysis.formats import (NULL_WORD, Alignments, TranslationTable, format_parallel, iter_parallel_tokens,
                                 read_alignments, read_table)
from nat_kd.corpus import CorpusError
from nat_kd.errors import SettingsError

UNINITIALISED_PROB = 1e-9  # fast_align's t(y|x) before the first normalisation
CHUNK_LINKS = 1 << 20  # links per E-step piece: keeps temporaries to a few MB whatever the corpus size
SHARD_LINKS = 1 << 24  # links per shard of the corpus: one shard's index arrays (8-16 bytes a link) in memory


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
            raise SettingsError("-I (iterations) must be >= 1")
        if self.variational_bayes and self.alpha <= 0:
            raise SettingsError("-a (alpha) must be > 0 with variational Bayes (-v)")
        if not 0 <= self.p_null < 1:
            raise SettingsError("-q (p_null) must be in [0, 1)")

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


# ------------------------------------------------------------------ the training trace

@dataclass
class IterationLog:
    """One EM iteration's numbers, as fast_align prints them to stderr."""

    number: int                  # 1-based
    final: bool
    log_likelihood: float        # natural log, summed over target tokens
    target_tokens: int
    null_posterior: float        # fast_align's c0: summed posterior of the NULL links (0 in the final pass)
    feature: float | None        # mean posterior diagonal feature, when the tension is optimised
    tension_steps: list[tuple[float, float]] = field(default_factory=list)  # (model feature, tension) per step
    tension: float = 0.0         # the tension after this iteration

    def format(self) -> str:
        def g(x):  # C++ ostream's default: 6 significant digits
            return f"{x:.6g}"

        log2 = self.log_likelihood / np.log(2)
        entropy = -log2 / self.target_tokens
        lines = [f"ITERATION {self.number}{' (FINAL)' if self.final else ''}",
                 f"  log_e likelihood: {g(self.log_likelihood)}", f"  log_2 likelihood: {g(log2)}",
                 f"     cross entropy: {g(entropy)}", f"        perplexity: {g(2.0 ** entropy)}",
                 f"      posterior p0: {g(self.null_posterior / self.target_tokens)}"]
        if self.feature is not None:
            lines.append(f" posterior al-feat: {g(self.feature)}")
        lines += [f"  {k}  model al-feat: {g(feature)} (tension={g(tension)})"
                  for k, (feature, tension) in enumerate(self.tension_steps, 1)]
        if self.tension_steps:
            lines.append(f"     final tension: {g(self.tension)}")
        return "\n".join(lines)


@dataclass
class AlignmentResult:
    """What a fast_align run yields: Viterbi links, the (unpruned) table, and the training trace.

    Links are kept per shard of the corpus (in memory, or on disk for a large corpus): read them with
    ``alignment_shards``; ``alignments`` joins them into one object, which holds every link in memory.
    """

    table: TranslationTable | None
    options: AlignerOptions
    final_tension: float
    num_sentences: int
    link_shards: Callable[[], Iterator[Alignments]] | None  # None when the final (Viterbi) pass was skipped
    log: list[IterationLog] = field(default_factory=list)

    def alignment_shards(self) -> Iterator[Alignments]:
        """The links shard by shard, in corpus order; sentence numbers count from each shard's first."""
        if self.link_shards is None:
            raise CorpusError("no links: this run skipped fast_align's final (Viterbi) pass")
        return self.link_shards()

    @property
    def alignments(self) -> Alignments:
        parts, offset = [], 0
        for part in self.alignment_shards():
            parts.append((part.sentence + offset, part.source, part.target))
            offset += part.num_sentences
        if not parts:
            return Alignments(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), offset)
        return Alignments(*(np.concatenate(column).astype(np.int64) for column in zip(*parts)), offset)

    def format_log(self) -> str:
        """The per-iteration part of fast_align's stderr, for comparing a run with the binary's."""
        return "".join(entry.format() + "\n" for entry in self.log)

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
    """Sum over source positions 1..n of exp(tension * feature), in closed form (two geometric series).

    Also called with m and n swapped (see ``_compute_dlogz``); then ``floor`` can pass n, and fast_align's
    unsigned ``n - floor`` wraps to a huge count whose power of ``ratio`` (< 1) is 0: ``inf`` reproduces that.
    """
    split = j1 * n / m
    floor = np.floor(split)
    ceil = floor + 1
    ratio = np.exp(-tension / n)
    num_top = n - floor
    with np.errstate(over="ignore"):
        top_count = np.where(num_top < 0, np.inf, num_top)
    ezt = np.where(num_top != 0, np.exp(_feature(j1, ceil, m, n) * tension)
                   * (1.0 - ratio ** top_count) / (1.0 - ratio), 0.0)
    ezb = np.where(floor > 0, np.exp(_feature(j1, floor, m, n) * tension)
                   * (1.0 - ratio ** floor) / (1.0 - ratio), 0.0)
    return ezb + ezt


def _arith_geom_series(a_1, g_1, r, d, count):
    g_np1 = g_1 * r ** count
    a_n = d * (count - 1) + a_1
    rm1 = r - 1
    return (a_n * g_np1 - a_1 * g_1) / rm1 - d * (g_np1 - g_1 * r) / (rm1 * rm1)


def _compute_dlogz(j1, m, n, tension):
    """The model's expected feature at target position j1, exactly as fast_align computes it.

    This is d log Z / d tension but for the normaliser: fast_align's ``ComputeDLogZ`` (da.h, the release
    that writes ``-p`` tables) divides by ``ComputeZ(i, n, m)``, with the two lengths swapped. The tension
    it learns follows from that, so the same swap is needed to reproduce its tables and links.
    """
    z = _compute_z(j1, n, m, tension)
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


# ------------------------------------------------------------------ the corpus, read once, in shards

def _index_dtype(size: int):
    """int32 indexes while they fit (half the memory and bandwidth), int64 beyond 2**31."""
    return np.int32 if size < 2 ** 31 else np.int64


class _ShardStore:
    """Each shard's arrays: in memory while the corpus is a single shard, in ``.npy`` files once it is not.

    A corpus of one shard (Multi30k-sized) never touches the disk; a larger one keeps only the shard being
    worked on in memory. The files live in a temporary folder removed with the store.
    """

    def __init__(self):
        self._shards: list[dict] = []
        self._folder: tempfile.TemporaryDirectory | None = None

    def __len__(self) -> int:
        return len(self._shards)

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        if self._shards and self._folder is None:  # a second shard: move everything to disk from now on
            self._folder = tempfile.TemporaryDirectory(prefix="nat_kd_align_")
            for number, shard in enumerate(self._shards):
                self._shards[number] = {}
                self.update(number, shard)
        self._shards.append({})
        self.update(len(self._shards) - 1, arrays)

    def update(self, number: int, arrays: dict[str, np.ndarray | None]) -> None:
        """Set (or, with None, drop) arrays of shard ``number``."""
        shard = self._shards[number]
        for name, array in arrays.items():
            if array is None:
                stored = shard.pop(name, None)
                if isinstance(stored, Path):
                    stored.unlink()
            elif self._folder is None:
                shard[name] = array
            else:
                path = Path(self._folder.name) / f"{number}.{name}.npy"
                np.save(path, array)
                shard[name] = path

    def get(self, number: int) -> dict[str, np.ndarray]:
        return {name: np.load(value) if isinstance(value, Path) else value
                for name, value in self._shards[number].items()}


class _Corpus:
    """A tokenised parallel corpus as integer ids, read once into shards of about ``shard_links`` links.

    What stays in memory is what fast_align itself holds: the vocabularies (ids in order of first appearance,
    as its ``Dict``), the distinct co-occurring (source word, target word) pairs, which are the table's
    entries, and the count of each (target length, source length) shape. Per shard the store keeps the
    lengths, the target word ids, and for every (target token, source position) link its table entry and
    its cell of the diagonal prior.
    """

    def __init__(self, pairs: Iterable[tuple[list[str], list[str]]], reverse: bool, shard_links: int):
        self.src_index = collections.defaultdict(itertools.count().__next__)
        self.tgt_index = collections.defaultdict(itertools.count().__next__)
        self.store = _ShardStore()
        self.shard_sentences: list[int] = []
        self.keys = np.empty(0, np.int64)  # distinct pairs as (source word << 32 | target word), sorted
        shape_keys, shape_counts = np.empty(0, np.int64), np.empty(0, np.int64)
        src_buffer, tgt_buffer, links = [], [], 0
        for number, (src, tgt) in enumerate(pairs, 1):
            if reverse:
                src, tgt = tgt, src
            if not src or not tgt:
                raise CorpusError(f"line {number}: empty sentence; fast_align cannot align it. Remove the pair.")
            src_buffer.append(src)
            tgt_buffer.append(tgt)
            links += len(src) * len(tgt)
            if links >= shard_links:
                shape_keys, shape_counts = self._add_shard(src_buffer, tgt_buffer, shape_keys, shape_counts)
                src_buffer, tgt_buffer, links = [], [], 0
        if src_buffer:
            shape_keys, shape_counts = self._add_shard(src_buffer, tgt_buffer, shape_keys, shape_counts)
        if not self.shard_sentences:
            raise CorpusError("empty corpus: nothing to align")
        self.num_sentences = sum(self.shard_sentences)
        self.src_vocab, self.tgt_vocab = list(self.src_index), list(self.tgt_index)
        self.num_pairs = len(self.keys)
        self.num_entries = self.num_pairs + len(self.tgt_vocab)
        # row 0 is NULL, row r > 0 is source word r - 1; the NULL entries follow the pairs, one per target word
        self.entry_row = np.concatenate(((self.keys >> 32) + 1, np.zeros(len(self.tgt_vocab), np.int64)))
        self.entry_col = np.concatenate((self.keys & 0xFFFFFFFF, np.arange(len(self.tgt_vocab))))
        self.num_rows = len(self.src_vocab) + 1
        self.prior = _DiagonalPrior(shape_keys >> 32, shape_keys & 0xFFFFFFFF, shape_counts)
        self.num_tokens = int(np.dot(self.prior.shape_m, shape_counts))
        for number in range(len(self.store)):
            self._index_links(number, shape_keys)

    def _add_shard(self, src_lists, tgt_lists, shape_keys, shape_counts):
        n = np.fromiter(map(len, src_lists), np.int64, len(src_lists))
        m = np.fromiter(map(len, tgt_lists), np.int64, len(tgt_lists))
        src_ids = np.fromiter(map(self.src_index.__getitem__, itertools.chain.from_iterable(src_lists)), np.int64,
                              int(n.sum()))
        tgt_ids = np.fromiter(map(self.tgt_index.__getitem__, itertools.chain.from_iterable(tgt_lists)), np.int64,
                              int(m.sum()))
        shard = _Shard(n, m)
        local_keys, local_pair = shard.pair_ids(src_ids, tgt_ids, len(self.tgt_index))
        self.keys = np.union1d(self.keys, local_keys)
        shapes, counts = np.unique((m << 32) | n, return_counts=True)
        shape_keys, where = np.unique(np.concatenate((shape_keys, shapes)), return_inverse=True)
        shape_counts = np.bincount(where, np.concatenate((shape_counts, counts)), len(shape_keys)).astype(np.int64)
        self.store.add({"n": n.astype(np.int32), "m": m.astype(np.int32), "tgt": tgt_ids.astype(np.int32),
                        "local_keys": local_keys, "local_pair": local_pair})
        self.shard_sentences.append(len(n))
        return shape_keys, shape_counts

    def _index_links(self, number: int, shape_keys: np.ndarray) -> None:
        """Replace a shard's shard-local pair numbers by table entries, and add each link's prior cell."""
        arrays = self.store.get(number)
        pair = np.searchsorted(self.keys, arrays["local_keys"]).astype(_index_dtype(self.num_entries))
        shard = self.shard(number, arrays)
        shape = np.searchsorted(shape_keys, (shard.m << 32) | shard.n)
        prior = np.empty(shard.num_links, _index_dtype(self.prior.num_cells))
        token_cell = self.prior.offset[shape][shard.token_sentence] + shard.token_j * shard.n_of_token
        for tokens, span in shard.chunks():
            prior[span] = np.repeat(token_cell[tokens], shard.n_of_token[tokens]) + shard.source_position(tokens, span)
        self.store.update(number, {"pair": pair[arrays["local_pair"]], "prior": prior,
                                   "local_keys": None, "local_pair": None})

    def shard(self, number: int, arrays: dict | None = None) -> "_Shard":
        arrays = self.store.get(number) if arrays is None else arrays
        shard = _Shard(arrays["n"].astype(np.int64), arrays["m"].astype(np.int64))
        shard.tgt, shard.pair, shard.prior_index = arrays["tgt"], arrays.get("pair"), arrays.get("prior")
        return shard

    def shards(self) -> Iterator["_Shard"]:
        for number in range(len(self.store)):
            yield self.shard(number)


class _Shard:
    """Token-level index arrays of one shard, rebuilt from its lengths whenever it is read.

    Links are ordered by sentence, then target position, then source position, so the links of one target
    token are contiguous (``start``/``n_of_token``).
    """

    tgt: np.ndarray
    pair: np.ndarray | None
    prior_index: np.ndarray | None

    def __init__(self, n: np.ndarray, m: np.ndarray):
        self.n, self.m = n, m
        self.num_sentences, self.num_tokens = len(n), int(m.sum())
        tgt_start = np.concatenate(([0], np.cumsum(m)[:-1]))
        self.token_sentence = np.repeat(np.arange(len(n)), m)
        self.token_j = np.arange(self.num_tokens) - np.repeat(tgt_start, m)
        self.n_of_token = n[self.token_sentence]
        self.start = np.concatenate(([0], np.cumsum(self.n_of_token)[:-1]))
        self.num_links = int(self.n_of_token.sum())

    def source_position(self, tokens: slice, span: slice) -> np.ndarray:
        """0-based source position of each link in a chunk."""
        return np.arange(span.start, span.stop) - np.repeat(self.start[tokens], self.n_of_token[tokens])

    def chunks(self) -> Iterator[tuple[slice, slice]]:
        """(token slice, link slice) pieces of about CHUNK_LINKS links: bounded temporaries, cache-sized work."""
        ends = np.searchsorted(self.start, np.arange(CHUNK_LINKS, self.num_links, CHUNK_LINKS))
        bounds = np.unique(np.concatenate(([0], ends, [self.num_tokens])))
        link_bounds = np.append(self.start, self.num_links)
        for t0, t1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            yield slice(t0, t1), slice(int(link_bounds[t0]), int(link_bounds[t1]))

    def pair_ids(self, src_ids, tgt_ids, tgt_vocab_size):
        """The shard's distinct pairs as (source word << 32 | target word), sorted, and each link's index into them.

        Each key (source word * |Vy| + target word, small enough here) is packed with its link number into
        one int64 and sorted in place: one plain sort and one scatter, about half the time and memory of
        ``np.unique(return_inverse=True)``.
        """
        key = np.empty(self.num_links, dtype=np.int64)
        src_start = np.concatenate(([0], np.cumsum(self.n)[:-1]))[self.token_sentence]
        for tokens, span in self.chunks():
            lengths = self.n_of_token[tokens]
            src_word = np.take(src_ids, np.repeat(src_start[tokens], lengths) + self.source_position(tokens, span))
            key[span] = src_word * tgt_vocab_size + np.repeat(tgt_ids[tokens], lengths)
        index_bits = max(self.num_links - 1, 1).bit_length()
        if int(key.max()).bit_length() + index_bits > 62:  # too big to pack: the plain way
            unique_keys, pair = np.unique(key, return_inverse=True)
            pair = pair.astype(_index_dtype(len(unique_keys)))
        else:
            key <<= index_bits
            for tokens, span in self.chunks():
                key[span] |= np.arange(span.start, span.stop, dtype=np.int64)
            key.sort()
            order = key & ((1 << index_bits) - 1)
            key >>= index_bits
            new = np.empty(self.num_links, dtype=bool)
            new[0] = True
            np.not_equal(key[1:], key[:-1], out=new[1:])
            unique_keys = key[new]
            del key
            ids = np.cumsum(new, dtype=_index_dtype(len(unique_keys)))
            ids -= 1
            pair = np.empty(self.num_links, dtype=ids.dtype)
            pair[order] = ids
        return ((unique_keys // tgt_vocab_size) << 32) | (unique_keys % tgt_vocab_size), pair

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


class _DiagonalPrior:
    """fast_align's diagonal prior: one m x n block of cells per distinct (target length m, source length n)."""

    def __init__(self, shape_m: np.ndarray, shape_n: np.ndarray, shape_count: np.ndarray):
        self.shape_m, self.shape_n, self.shape_count = shape_m, shape_n, shape_count
        sizes = shape_m * shape_n
        self.offset = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        self.num_cells = int(sizes.sum())
        local = np.arange(self.num_cells) - np.repeat(self.offset, sizes)
        block_n = np.repeat(shape_n, sizes)
        self.block_m = np.repeat(shape_m, sizes).astype(np.float64)
        self.block_n = block_n.astype(np.float64)
        self.block_j1 = (local // block_n + 1).astype(np.float64)
        self.block_i1 = (local % block_n + 1).astype(np.float64)
        # one entry per (shape, 1-based target position), weighted by the shape's count: the model feature's terms
        rows = np.arange(int(shape_m.sum())) - np.repeat(np.concatenate(([0], np.cumsum(shape_m)[:-1])), shape_m)
        self.row_j1 = (rows + 1).astype(np.float64)
        self.row_m = np.repeat(shape_m, shape_m).astype(np.float64)
        self.row_n = np.repeat(shape_n, shape_m).astype(np.float64)
        self.row_weight = np.repeat(shape_count, shape_m)

    def cells(self, tension: float, p_not_null: float) -> np.ndarray:
        az = _compute_z(self.block_j1, self.block_m, self.block_n, tension) / p_not_null
        return np.exp(_feature(self.block_j1, self.block_i1, self.block_m, self.block_n) * tension) / az

    def feature0_cells(self) -> np.ndarray:
        # fast_align's empirical feature uses the 0-based target index j (not j + 1)
        return _feature(self.block_j1 - 1, self.block_i1, self.block_m, self.block_n)

    def optimise_tension(self, tension: float, emp_feat: float, num_tokens: int) -> tuple[float, list]:
        """fast_align's 8 gradient steps on the tension; returns it with the (model feature, tension) steps."""
        steps = []
        for _ in range(8):
            model = _compute_dlogz(self.row_j1, self.row_m, self.row_n, tension)
            mod_feat = float(np.dot(self.row_weight, model)) / num_tokens
            steps.append((mod_feat, tension))
            tension += (emp_feat - mod_feat) * 20.0
            tension = 0.1 if tension <= 0.1 else min(tension, 14.0)
        return tension, steps


# ------------------------------------------------------------------ the model

class FastAlign:
    """Train fast_align's model on a tokenised parallel corpus and return links and table."""

    def __init__(self, options: AlignerOptions = RECOMMENDED, shard_links: int | None = None):
        self.options = options
        self.shard_links = shard_links or SHARD_LINKS

    def align_lines(self, src: list[str], tgt: list[str], viterbi: bool = True) -> AlignmentResult:
        """Align whitespace-tokenised, line-aligned sentences (each side non-empty)."""
        if len(src) != len(tgt):
            raise CorpusError(f"{len(src)} source but {len(tgt)} target sentences")
        return self.align(((s.split(), t.split()) for s, t in zip(src, tgt)), viterbi)

    def align_file(self, path: str | os.PathLike, viterbi: bool = True) -> AlignmentResult:
        """Align a fast_align input file (``src ||| tgt``, tokenised), like ``fast_align -i path``."""
        return self.align(iter_parallel_tokens(path), viterbi)

    def align(self, pairs: Iterable[tuple[list[str], list[str]]], viterbi: bool = True) -> AlignmentResult:
        """Align (source tokens, target tokens) pairs, read once from any iterable.

        ``viterbi=False`` skips fast_align's final pass, which only finds the links: the table is the same.
        """
        opt = self.options
        corpus = _Corpus(pairs, opt.reverse, self.shard_links)
        tension = opt.diagonal_tension
        t, log, link_shards = None, [], None
        for iteration in range(opt.iterations):
            final = iteration == opt.iterations - 1
            if final and not viterbi:
                break
            want_feature = opt.favor_diagonal and opt.optimize_tension and iteration > 0 and not final
            entry = IterationLog(iteration + 1, final, 0.0, corpus.num_tokens, 0.0,
                                 0.0 if want_feature else None, tension=tension)
            prior_cells = corpus.prior.cells(tension, 1.0 - opt.p_null) if opt.favor_diagonal else None
            feature_cells = corpus.prior.feature0_cells() if want_feature else None
            counts = None if final else np.zeros(corpus.num_entries)
            for number, shard in enumerate(corpus.shards()):
                found = []
                for tokens, span in shard.chunks():
                    part = self._chunk_pass(corpus, shard, t, prior_cells, feature_cells, tokens, span, final, entry)
                    if final:
                        found.append(part)
                    else:
                        counts += part
                if final:
                    corpus.store.update(number, self._links(shard, found))
            log.append(entry)
            if final:
                link_shards = functools.partial(self._link_shards, corpus)
                break
            if want_feature:
                entry.feature /= corpus.num_tokens
                tension, entry.tension_steps = corpus.prior.optimise_tension(tension, entry.feature, corpus.num_tokens)
                entry.tension = tension
            t = self._normalise(counts, corpus.entry_row, corpus.num_rows)
        table = None
        if t is not None:
            table = TranslationTable([NULL_WORD] + corpus.src_vocab, corpus.tgt_vocab, corpus.entry_row,
                                     corpus.entry_col, t)
            if opt.no_null_word:
                table = table.without_null()
        return AlignmentResult(table, opt, tension, corpus.num_sentences, link_shards, log)

    def _chunk_pass(self, corpus, shard, t, prior_cells, feature_cells, tokens: slice, span: slice, final: bool,
                    entry: IterationLog):
        """E-step over one chunk, adding to ``entry``'s sums; returns its counts (or, when final, its links)."""
        opt = self.options
        use_null = not opt.no_null_word
        # p(a_j = i) t(y_j | x_i) for every link of the chunk, and for NULL
        if opt.favor_diagonal:
            probs = np.take(prior_cells, shard.prior_index[span])
            null_prior = opt.p_null
        else:
            null_prior = 1.0 / (shard.n_of_token[tokens] + use_null)
            probs = np.repeat(null_prior, shard.n_of_token[tokens])
        probs *= UNINITIALISED_PROB if t is None else np.take(t, shard.pair[span])
        sums = np.add.reduceat(probs, shard.start[tokens] - span.start)
        null_probs = None
        if use_null:
            null_entries = corpus.num_pairs + shard.tgt[tokens]
            null_probs = null_prior * (UNINITIALISED_PROB if t is None else t[null_entries])
            sums += null_probs
        entry.log_likelihood += float(np.log(sums).sum())
        if final:
            return shard.viterbi(probs, null_probs, tokens, span)
        inv = 1.0 / sums
        probs *= np.repeat(inv, shard.n_of_token[tokens])  # now posteriors
        counts = np.bincount(shard.pair[span], probs, minlength=corpus.num_entries)
        if use_null:
            null_posteriors = null_probs * inv
            counts += np.bincount(null_entries, null_posteriors, minlength=corpus.num_entries)
            entry.null_posterior += float(null_posteriors.sum())
        if feature_cells is not None:
            entry.feature += float(np.dot(probs, np.take(feature_cells, shard.prior_index[span])))
        return counts

    def _normalise(self, counts, row, num_rows):
        if self.options.variational_bayes:
            alpha = self.options.alpha
            totals = np.bincount(row, counts + alpha, minlength=num_rows)
            totals[totals == 0] = 1.0
            return np.exp(digamma(counts + alpha) - digamma(totals)[row])
        totals = np.bincount(row, counts, minlength=num_rows)
        totals[totals == 0] = 1.0
        return counts / totals[row]

    def _links(self, shard: _Shard, found) -> dict[str, np.ndarray]:
        """A shard's Viterbi links as (sentence, source, target) arrays, oriented source-target."""
        token = np.concatenate([f[0] for f in found])
        i = np.concatenate([f[1] for f in found]).astype(np.int32)
        j = shard.token_j[token].astype(np.int32)
        source, target = (j, i) if self.options.reverse else (i, j)
        return {"link_sentence": shard.token_sentence[token].astype(np.int32), "link_source": source,
                "link_target": target}

    @staticmethod
    def _link_shards(corpus: _Corpus) -> Iterator[Alignments]:
        for number, sentences in enumerate(corpus.shard_sentences):
            arrays = corpus.store.get(number)
            yield Alignments(arrays["link_sentence"], arrays["link_source"], arrays["link_target"], sentences)


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
        # one thread: with OpenMP threads fast_align's count update races, and two runs can differ
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "LC_ALL": "C", "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            raise CorpusError(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr[-500:]}")
        links_file = Path(tmp) / "links.txt"
        links_file.write_text(done.stdout, encoding="utf-8")
        alignments = read_alignments(links_file)
        if alignments.num_sentences != len(src):
            raise CorpusError(f"fast_align wrote {alignments.num_sentences} alignment lines for {len(src)} pairs")
        ttable = read_table(table) if table.exists() and table.stat().st_size else None
    # the table file is already pruned; pruning again with the same threshold keeps it as it is
    return AlignmentResult(ttable, options, float("nan"), alignments.num_sentences, lambda: iter([alignments]))
