"""The teacher's precomputed top-k log-probabilities (offline word-level KD): the file format, and its reader.

``python -m nat_kd.teacher_topk`` writes, for each split, memory-mappable numpy arrays in one folder:
    SPLIT.index.npy    N x k  token ids, best first (uint16 when the dictionary fits, else int32)
    SPLIT.lprobs.npy   N x k  the teacher's log-probabilities at temperature 1 (float16 or float32)
    SPLIT.offsets.npy  S+1    int64: sentence i's target tokens (EOS included) are rows offsets[i]:offsets[i+1]
    meta.json          k, dictionary size and hash, teachers, dtypes, sentence and token counts
N is the number of target tokens of the split, S its number of sentences; rows are looked up by fairseq's
sample["id"]. The criterion (``--teacher-topk-path DIR``) reads them here, next to the criterion, so the
plugin needs nothing from nat_kd.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fairseq_plugins.teacher import TeacherError

FORMAT_VERSION = 1
SPLIT_ARRAYS = ("offsets", "index", "lprobs")


class TopKError(TeacherError):
    """Top-k files that do not fit the data or dictionary at hand: the message names the file and the fix."""


def dictionary_hash(dictionary) -> str:
    return hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()


def index_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32


def target_rows(offsets: np.ndarray, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Row numbers of every target token of sentences ``ids`` (lengths tokens each), sentence after sentence."""
    starts = np.repeat(offsets[ids], lengths)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return starts + within


def array_path(directory, split: str, name: str) -> Path:
    """SPLIT.NAME.npy, NAME one of SPLIT_ARRAYS."""
    return Path(directory) / f"{split}.{name}.npy"


class TeacherTopK:
    """Read-only, memory-mapped view of a folder written by ``python -m nat_kd.teacher_topk``."""

    def __init__(self, directory):
        self.directory = Path(directory)
        meta_file = self.directory / "meta.json"
        if not meta_file.is_file():
            raise TopKError(f"{meta_file} not found: --teacher-topk-path must be a folder written by "
                            "python -m nat_kd.teacher_topk")
        self.meta = json.loads(meta_file.read_text())
        self.k = self.meta["k"]
        self._splits = {}

    def check_dictionary(self, dictionary) -> None:
        if self.meta["vocab_size"] != len(dictionary) or self.meta["dictionary_sha256"] != dictionary_hash(dictionary):
            raise TopKError(f"{self.directory} was computed with a different target dictionary "
                            f"({self.meta['vocab_size']} entries) than the student's ({len(dictionary)} entries): "
                            "recompute it with python -m nat_kd.teacher_topk on the student's data-bin")

    def has_split(self, split: str) -> bool:
        return split in self.meta["splits"]

    def _arrays(self, split: str):
        if split not in self._splits:
            if not self.has_split(split):
                raise TopKError(f"{self.directory} has no '{split}' split (it has {sorted(self.meta['splits'])}): "
                                f"recompute with python -m nat_kd.teacher_topk ... --splits train,{split}")
            self._splits[split] = tuple(np.load(array_path(self.directory, split, name), mmap_mode="r")
                                        for name in SPLIT_ARRAYS)
        return self._splits[split]

    def lookup(self, split: str, ids: np.ndarray, lengths: np.ndarray):
        """(index int64 N x k, log-probabilities float32 N x k) for the target tokens of sentences ``ids``."""
        offsets, index, lprobs = self._arrays(split)
        stored = offsets[ids + 1] - offsets[ids]
        bad = np.flatnonzero(stored != lengths)
        if bad.size:
            i = bad[0]
            raise TopKError(f"{self.directory} ({split}): sentence {ids[i]} has {stored[i]} target tokens there but "
                            f"{lengths[i]} in the batch; the top-k was computed on other data: recompute it with "
                            "python -m nat_kd.teacher_topk on the student's data-bin")
        rows = target_rows(offsets, ids, lengths)
        order = np.argsort(rows, kind="stable")  # memory maps read fastest in file order
        sorted_rows = rows[order]
        out_index = np.empty((len(rows), self.k), dtype=np.int64)
        out_lprobs = np.empty((len(rows), self.k), dtype=np.float32)
        out_index[order] = index[sorted_rows]
        out_lprobs[order] = lprobs[sorted_rows]
        return out_index, out_lprobs
