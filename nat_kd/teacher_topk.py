"""Offline word-level KD: precompute a teacher's top-k log-probabilities per target token, once.

    python -m nat_kd.teacher_topk DATA_BIN --teacher-path TEACHER.pt[:TEACHER2.pt] --k 8 --out DIR

writes, for each split (default train and valid), memory-mappable numpy arrays in DIR:
    SPLIT.index.npy    N x k  token ids, best first (uint16 when the dictionary fits, else int32)
    SPLIT.lprobs.npy   N x k  the teacher's log-probabilities at temperature 1 (float16 or float32)
    SPLIT.offsets.npy  S+1    int64: sentence i's target tokens (EOS included) are rows offsets[i]:offsets[i+1]
    meta.json          k, dictionary size and hash, teachers, dtypes, sentence and token counts
N is the number of target tokens of the split, S its number of sentences; rows are looked up by fairseq's
sample["id"]. The criterion ``word_kd --teacher-topk-path DIR`` trains from them; the temperature is applied
at training time (softmax of the stored log-probabilities / T, renormalised over the k kept tokens), so one
precomputation serves every temperature. With k = the vocabulary size the loss equals the online loss
(float32: to float rounding; float16: log-probabilities rounded to ~1e-3 relative, see docs/results/word_kd.md).
The folder is written whole, atomically (temporary folder + rename).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path

import numpy as np

from . import atomic

logger = logging.getLogger("nat_kd.teacher_topk")
FORMAT_VERSION = 1
# float16 cannot hold -inf-like values; real log-probabilities are far above this
FLOAT16_FLOOR = -1e4


class TopKError(ValueError):
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


def compute_teacher_topk(data_bin, teacher_path: str, out_dir, k: int = 8, splits=("train", "valid"),
                         dtype: str = "float16", max_tokens: int = 8192, teacher_data=None) -> Path:
    """Run the teacher(s) with teacher forcing over the binarized ``splits`` of ``data_bin``; see module doc."""
    import torch
    from fairseq import tasks, utils
    from omegaconf import open_dict

    from fairseq_plugins.criterions.teachers import teacher_log_probs
    from fairseq_plugins.teachers import check_same_dictionary, load_teachers

    if dtype not in ("float16", "float32"):
        raise TopKError(f"--dtype {dtype}: choose float16 or float32")
    teachers, teacher_task, _, _ = load_teachers(teacher_path, teacher_data)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        teachers = tuple(t.cuda() for t in teachers)
    task_cfg = teacher_task.cfg.copy()
    with open_dict(task_cfg):
        task_cfg.data = str(data_bin)
    task = tasks.setup_task(task_cfg)
    check_same_dictionary("source", teacher_task.source_dictionary, task.source_dictionary, teacher_path, data_bin)
    check_same_dictionary("target", teacher_task.target_dictionary, task.target_dictionary, teacher_path, data_bin)
    vocab = len(task.target_dictionary)
    if not 1 <= k <= vocab:
        raise TopKError(f"--k {k}: must be between 1 and the dictionary size {vocab}")
    pad = task.target_dictionary.pad()
    meta = {"format_version": FORMAT_VERSION, "k": k, "vocab_size": vocab,
            "dictionary_sha256": dictionary_hash(task.target_dictionary),
            "index_dtype": np.dtype(index_dtype(vocab)).name, "lprobs_dtype": dtype,
            "teachers": [str(Path(p).resolve()) for p in teacher_path.split(":") if p],
            "data": str(Path(data_bin).resolve()), "splits": {}}

    with atomic.building_directory(out_dir) as work:
        for split in splits:
            task.load_dataset(split)
            dataset = task.dataset(split)
            offsets = np.concatenate([[0], np.cumsum(dataset.tgt_sizes, dtype=np.int64)])
            total = int(offsets[-1])
            index = np.lib.format.open_memmap(work / f"{split}.index.npy", "w+", index_dtype(vocab), (total, k))
            lprobs = np.lib.format.open_memmap(work / f"{split}.lprobs.npy", "w+", np.dtype(dtype), (total, k))
            written = 0
            batches = task.get_batch_iterator(dataset, max_tokens=max_tokens, required_batch_size_multiple=1,
                                              ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
            for sample in batches:
                sample = utils.move_to_cuda(sample) if use_cuda else sample
                net_input = sample["net_input"]
                target = sample["target"]
                log_probs = teacher_log_probs(teachers, net_input["src_tokens"], net_input["src_lengths"],
                                              net_input["prev_output_tokens"])
                mask = target.ne(pad)
                top_lprobs, top_index = log_probs[mask].topk(k, dim=-1)
                rows = target_rows(offsets, sample["id"].cpu().numpy(), mask.sum(1).cpu().numpy())
                index[rows] = top_index.cpu().numpy().astype(index.dtype)
                lprobs[rows] = top_lprobs.clamp(min=FLOAT16_FLOOR).cpu().numpy().astype(lprobs.dtype)
                written += len(rows)
            if written != total:
                raise TopKError(f"{data_bin} {split}: wrote {written} of {total} target tokens; "
                                "some sentences were skipped (too long for the teacher?)")
            index.flush()
            lprobs.flush()
            del index, lprobs
            np.save(work / f"{split}.offsets.npy", offsets)
            meta["splits"][split] = {"sentences": len(dataset), "tokens": total}
            logger.info("%s: %d sentences, %d target tokens, top-%d", split, len(dataset), total, k)
        atomic.write_json(work / "meta.json", meta)
    return Path(out_dir)


class TeacherTopK:
    """Read-only, memory-mapped view of a folder written by ``compute_teacher_topk``."""

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
            self._splits[split] = tuple(np.load(self.directory / f"{split}.{name}.npy", mmap_mode="r")
                                        for name in ("offsets", "index", "lprobs"))
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nat_kd.teacher_topk", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_bin", help="fairseq binarized data folder (the student's)")
    parser.add_argument("--teacher-path", required=True, help="teacher checkpoint(s), colon-separated for an ensemble")
    parser.add_argument("--out", required=True, help="output folder (replaced whole)")
    parser.add_argument("--k", type=int, default=8, help="how many of the teacher's most likely tokens to keep")
    parser.add_argument("--splits", default="train,valid", help="comma-separated fairseq splits")
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32"],
                        help="storage of the log-probabilities")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--teacher-data", default=None,
                        help="folder with the teacher's dictionaries (default: the one recorded in its checkpoint)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(name)s | %(message)s")
    import fairseq_plugins  # noqa: F401  (safe checkpoint loading, architectures)
    from fairseq_plugins.teachers import TeacherError

    try:
        out = compute_teacher_topk(args.data_bin, args.teacher_path, args.out, args.k,
                                   tuple(s for s in args.splits.split(",") if s), args.dtype,
                                   args.max_tokens, args.teacher_data)
    except (TeacherError, TopKError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
