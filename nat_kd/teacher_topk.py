"""Offline word-level KD: precompute a teacher's top-k log-probabilities per target token, once.

    python -m nat_kd.teacher_topk DATA_BIN --teacher-path TEACHER.pt[:TEACHER2.pt] --k 8 --out DIR

writes, for each split (default train and valid), the arrays the criterion ``word_kd --teacher-topk-path DIR``
reads (the format is fairseq_plugins/criterions/topk.py's, next to its reader). The temperature is applied
at training time (softmax of the stored log-probabilities / T, renormalised over the k kept tokens), so one
precomputation serves every temperature. With k = the vocabulary size the loss equals the online loss
(float32: to float rounding; float16: log-probabilities rounded to ~1e-3 relative, see docs/results/word_kd.md).
The folder is written whole, atomically (temporary folder + rename).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np


from . import atomic, cli

# fairseq and the plugin are imported inside the functions, after main has set up logging: importing fairseq
# logs already (nat_kd.cli.setup_logging)

logger = logging.getLogger("nat_kd.teacher_topk")
# float16 cannot hold -inf-like values; real log-probabilities are far above this
FLOAT16_FLOOR = -1e4


def compute_teacher_topk(data_bin, teacher_path: str, out_dir, k: int = 8, splits=("train", "valid"),
                         dtype: str = "float16", max_tokens: int = 8192, teacher_data=None) -> Path:
    """Run the teacher(s) with teacher forcing over the binarized ``splits`` of ``data_bin``; see module doc."""
    import torch
    from fairseq import tasks, utils
    from omegaconf import open_dict

    from fairseq_plugins.criterions.topk import (FORMAT_VERSION, TopKError, array_path, dictionary_hash,
                                                 index_dtype, target_rows)
    from fairseq_plugins.teacher import TeacherEnsemble

    if dtype not in ("float16", "float32"):
        raise TopKError(f"--dtype {dtype}: choose float16 or float32")
    atomic.check_replaceable(out_dir, "meta.json", "a teacher top-k folder", "--out")  # before the teacher runs
    teacher = TeacherEnsemble.load(teacher_path, teacher_data)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        teacher.to("cuda")
    task_cfg = teacher.task.cfg.copy()
    with open_dict(task_cfg):
        task_cfg.data = str(data_bin)
    task = tasks.setup_task(task_cfg)
    teacher.check_dictionaries(task.source_dictionary, task.target_dictionary, data_bin)
    vocab = len(task.target_dictionary)
    if not 1 <= k <= vocab:
        raise TopKError(f"--k {k}: must be between 1 and the dictionary size {vocab}")
    pad = task.target_dictionary.pad()
    meta = {"format_version": FORMAT_VERSION, "k": k, "vocab_size": vocab,
            "dictionary_sha256": dictionary_hash(task.target_dictionary),
            "index_dtype": np.dtype(index_dtype(vocab)).name, "lprobs_dtype": dtype,
            "teachers": [str(Path(p).resolve()) for p in teacher.paths],
            "data": str(Path(data_bin).resolve()), "splits": {}}

    with atomic.building_directory(out_dir) as work:
        for split in splits:
            task.load_dataset(split)
            dataset = task.dataset(split)
            offsets = np.concatenate([[0], np.cumsum(dataset.tgt_sizes, dtype=np.int64)])
            total = int(offsets[-1])
            index = np.lib.format.open_memmap(array_path(work, split, "index"), "w+", index_dtype(vocab), (total, k))
            lprobs = np.lib.format.open_memmap(array_path(work, split, "lprobs"), "w+", np.dtype(dtype), (total, k))
            written = 0
            batches = task.get_batch_iterator(dataset, max_tokens=max_tokens, required_batch_size_multiple=1,
                                              ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
            for sample in batches:
                sample = utils.move_to_cuda(sample) if use_cuda else sample
                net_input = sample["net_input"]
                target = sample["target"]
                log_probs = teacher.log_probs(net_input["src_tokens"], net_input["src_lengths"],
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
            np.save(array_path(work, split, "offsets"), offsets)
            meta["splits"][split] = {"sentences": len(dataset), "tokens": total}
            logger.info("%s: %d sentences, %d target tokens, top-%d", split, len(dataset), total, k)
        atomic.write_json(work / "meta.json", meta)
    return Path(out_dir)


def main(argv=None) -> int:
    cli.setup_logging(argv)
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
    cli.add_verbose_argument(parser)
    args = parser.parse_args(argv)

    def body() -> int:
        print(compute_teacher_topk(args.data_bin, args.teacher_path, args.out, args.k,
                                   tuple(s for s in args.splits.split(",") if s), args.dtype,
                                   args.max_tokens, args.teacher_data))
        return 0

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
