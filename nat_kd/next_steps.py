"""What to do with a distilled set: the fairseq-train command for a vanilla NAT student on it, and its twin on
the real data, ready to paste (the main job, scripts/main.sh, ends with them).

    python -m nat_kd.next_steps --prepared data/multi30k.en-de.spm8000 \\
        --distilled runs/multi30k.en-de/distill/beam5 --out runs/multi30k.en-de/students

The student is the kd-effect profile's vanilla NAT (docs/results/kd_effect/), built by the study's own
fairseq_jobs.train_args so that the two cannot drift apart. One difference: the study measures validation
BLEU every 250 updates and tests the best of those checkpoints, where a plain fairseq-train keeps the one with
the best validation loss (checkpoint_best.pt).
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path

from nat_kd import cli
from nat_kd.artifacts import BinarizedData, DistilledSet, PreparedCorpus
from nat_kd.errors import SettingsError

PROFILE = "kd-effect"
FAMILY = "nat"


def student_command(bin_dir: BinarizedData, save_dir: Path) -> str:
    """fairseq-train of the PROFILE's FAMILY student on ``bin_dir``, its checkpoints in ``save_dir``; absolute
    paths, so that it runs from any folder once the project's .venv is active."""
    # imported here, not at the top: they import fairseq, which logs at import unless cli.setup_logging ran first
    from nat_kd.study import config
    from nat_kd.study.fairseq_jobs import train_args
    from nat_kd.study.plan import student_arch

    if not bin_dir.root.is_dir():
        raise SettingsError(f"{bin_dir.root}: no such folder; is its parent nat_kd.prepare or "
                            "nat_kd.generate_distilled output?")
    cfg = config.load(PROFILE)
    # one plain run, no learning curve: fairseq saves at every epoch's end and keeps the best validation loss
    training = replace(cfg.student_training, bleu_every=0)
    args = train_args(bin_dir.root.resolve(), save_dir.resolve(), arch=student_arch(FAMILY), shape=cfg.student_shape,
                      training=training, nat_family=FAMILY)
    return shlex.join(["fairseq-train", *map(str, args)])


def student_commands(prepared: Path, distilled: Path, out: Path) -> list[str]:
    """The student on the distilled set (save dir OUT/nat.SETNAME), then its twin on the real data (OUT/nat.real)."""
    distilled_set = DistilledSet(distilled)
    return [student_command(distilled_set.bin, out / f"{FAMILY}.{distilled_set.root.name}"),
            student_command(PreparedCorpus(prepared).bin, out / f"{FAMILY}.real")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nat_kd.next_steps", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepared", required=True, type=Path, help="nat_kd.prepare output: the real data")
    p.add_argument("--distilled", required=True, type=Path,
                   help="a distilled set (nat_kd.generate_distilled or nat_kd.mix output)")
    p.add_argument("--out", required=True, type=Path, help="the folder for the students' checkpoints")
    return p


def main(argv=None) -> int:
    cli.setup_logging(argv)
    args = build_parser().parse_args(argv)

    def body():
        commands = student_commands(args.prepared, args.distilled, args.out)
        print(f"# the {PROFILE} profile's vanilla NAT student (docs/results/kd_effect/), in a shell with the "
              "project's .venv active (source .venv/bin/activate):")
        print("\n".join(commands))

    return cli.run(body)


if __name__ == "__main__":
    raise SystemExit(main())
