"""Where a NAT student's training time goes: fairseq's own training step (the task's noise, the criterion,
backward, Adam) for a few updates of a study profile's student, under torch's profiler, on one thread.

    .venv/bin/python scripts/benchmarks/profile_student_training.py --profile students --family dat \
        --data STUDY_DIR/work/prepare/data/bin [--updates 6] [--rows 12]

The fairseq-train arguments are the study's own (nat_kd.engine.fairseq_jobs), so the model, batches and
flags are those the study trains. Prints seconds per update, the operators with the most self CPU time, and
the same split by input shape (which tensor each share of the time went to).
"""
import argparse
import logging
import tempfile
import time
from dataclasses import replace

logging.basicConfig(level=logging.WARNING)  # before fairseq: it would otherwise turn on DEBUG logging

import torch  # noqa: E402
from fairseq import options, tasks  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402
from fairseq.trainer import Trainer  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from nat_kd.engine import fairseq_jobs  # noqa: E402
from nat_kd.study import config  # noqa: E402
from nat_kd.study.plan import student_arch  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="students", help="study profile name or TOML path")
    parser.add_argument("--family", required=True, help="a student family of STUDENT_FAMILIES")
    parser.add_argument("--data", required=True, help="a prepared data-bin folder (the study's work/prepare/data/bin)")
    parser.add_argument("--updates", type=int, default=6, help="profiled updates, after 2 unprofiled ones")
    parser.add_argument("--rows", type=int, default=12, help="operators printed per table")
    args = parser.parse_args()
    torch.set_num_threads(1)

    study = config.load(config.profile_path(args.profile))
    with tempfile.TemporaryDirectory() as save_dir:
        argv = fairseq_jobs.train_args(args.data, save_dir, arch=student_arch(args.family),
                                        shape=study.student_shape, nat_family=args.family,
                                        training=replace(study.student_training, validate_every=0))
        cfg = convert_namespace_to_omegaconf(
            options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv]))
        task = tasks.setup_task(cfg.task)
        task.load_dataset("train")
        trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
        batches = trainer.get_train_iterator(epoch=1).next_epoch_itr(shuffle=True)
        for _ in range(2):  # the first updates allocate what the rest reuse
            trainer.train_step([next(batches)])
        samples = [next(batches) for _ in range(args.updates)]
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for sample in samples:
                trainer.train_step([sample])
        seconds = (time.perf_counter() - start) / args.updates
    print(f"{args.family}: {seconds:.2f} s/update under the profiler ({args.updates} updates, one thread)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                                            max_shapes_column_width=80))


if __name__ == "__main__":
    main()
