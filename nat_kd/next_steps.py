"""What to do with a distilled set: the fairseq-train command of a NAT student on it and of its twin on the real
data, each with the fairseq-generate command that tests it, ready to paste (the main job, scripts/main.sh,
ends with them).

    python -m nat_kd.next_steps --prepared data/multi30k.en-de.spm8000 \\
        --distilled runs/multi30k.en-de/distill/beam5 --out runs/multi30k.en-de/students \\
        [--arch kd_glat_tiny] [--shape 2x128] [--updates 2000]
    python -m nat_kd.next_steps --from-ranking runs/choose/ranking.json --out runs/students

The default student is the studies' vanilla NAT (docs/results/kd_effect/): 2x128, 2,000 updates; any
kd_FAMILY_SIZE student takes the same recipe (the `students` profile's) with its family's flags
(docs/students.md), glancing annealed over the first two thirds of the updates. ``--from-ranking``
takes nat_kd.choose's best set, its corpus, and the student and shape it piloted. The commands come from the
study's own fairseq_jobs, so that the two cannot drift apart. One difference: the study measures validation
BLEU every 250 updates and tests the best of those checkpoints, where a plain fairseq-train keeps the one with
the best validation loss (checkpoint_best.pt).
"""
from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import replace
from pathlib import Path

from nat_kd import cli
from nat_kd.artifacts import BinarizedData, DistilledSet, PreparedCorpus
from nat_kd.choose import REAL
from nat_kd.errors import SettingsError

PROFILE = "students"  # kd-effect's student recipe, and the glancing schedule of the families that glance
DEFAULT_ARCH = "kd_nat_tiny"


def student_commands(bin_dir: BinarizedData, tokenization, languages: tuple[str, str], save_dir: Path, *,
                     arch: str, shape, updates: int | None, references: tuple[int, str] | None = None,
                     selective_kd: bool = False) -> list[str]:
    """fairseq-train of ``arch`` (``shape`` None: its own sizes) on ``bin_dir``, its checkpoints in ``save_dir``,
    then fairseq-generate of its best checkpoint on the test split; absolute paths, so that they run from any
    folder once the project's .venv is active. ``references`` (count, selection): a set of several references
    a sentence (nat_kd.references), which the student's loss takes; ``selective_kd``: a Selective KD set
    (nat_kd.selective_kd), its threshold rising over the run."""
    # imported here, not at the top: they import fairseq, which logs at import unless cli.setup_logging ran first
    from fairseq_plugins.models.nat import STUDENT_FAMILIES

    from nat_kd.study import config
    from nat_kd.engine.fairseq_jobs import ROOT, train_args
    from nat_kd.engine.steps import student_family

    if not bin_dir.root.is_dir():
        raise SettingsError(f"{bin_dir.root}: no such folder; is its parent nat_kd.prepare or "
                            "nat_kd.generate_distilled output?")
    family = student_family(arch)
    if references and not STUDENT_FAMILIES[family].references:
        takers = ", ".join(f"kd_{f}_tiny" for f, spec in STUDENT_FAMILIES.items() if spec.references)
        raise SettingsError(f"--arch {arch}: its loss takes one reference a sentence, and {bin_dir.root.parent} has "
                            f"{references[0]}: give a student that takes several ({takers}), or the sets' union "
                            "(nat_kd.references --union)")
    # one plain run, no learning curve: fairseq saves at every epoch's end and keeps the best validation loss
    training = replace(config.load(PROFILE).student_training, bleu_every=0)
    if updates:
        # glancing anneals over the same share of the run as in the profile (1,333 of 2,000 updates)
        share = training.glance_anneal_updates / training.updates
        training = replace(training, updates=updates, glance_anneal_updates=max(1, round(share * updates)))
    criterion = None
    if references:
        criterion = {"references": references[0], "reference_selection": references[1]}
        if references[1] == "ddrs":  # DDRS-NAT's schedule, 4 x 5,000 of 300,000 updates on the min alone, scaled
            criterion |= {"ddrs_max_update": training.updates,
                          "ddrs_save_interval_updates": round(training.updates * 5000 / 300000)}
    train = train_args(bin_dir.root.resolve(), save_dir.resolve(), arch=arch, shape=shape, training=training,
                       nat_family=family, references=criterion,
                       selective_kd={"kd_threshold_updates": training.updates} if selective_kd else None)
    student = STUDENT_FAMILIES[family]
    generate = [bin_dir.root.resolve(), "--user-dir", ROOT / "fairseq_plugins", "--task", student.task,
                *student.decode_flags, "--beam", 1, "--path", save_dir.resolve() / "checkpoint_best.pt",
                "--gen-subset", "test", "--max-tokens", 8192, "--required-batch-size-multiple", 1,
                *tokenization.fairseq_flags(*languages), "--scoring", "sacrebleu"]
    return [shlex.join(["fairseq-train", *map(str, train)]), shlex.join(["fairseq-generate", *map(str, generate)])]


def from_ranking(path: Path) -> dict:
    """nat_kd.choose's ranking.json: its corpus, the best set's folder, and the student and shape it piloted."""
    try:
        rank = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SettingsError(f"--from-ranking {path}: {err}; give nat_kd.choose's OUT/ranking.json") from None
    missing = [key for key in ("corpus", "arch", "shape", "sets", "rows") if key not in rank]
    if missing:
        raise SettingsError(f"--from-ranking {path}: no {', '.join(missing)}; a ranking written by an older "
                            "nat_kd.choose: run the same choose command again (its pilots are kept) to rewrite it")
    best = rank["rows"][0]["set"]
    return {"prepared": Path(rank["corpus"]), "distilled": None if best == REAL else Path(rank["sets"][best]),
            "arch": rank["arch"], "shape": rank["shape"], "best": best}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nat_kd.next_steps", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepared", type=Path, help="nat_kd.prepare output: the real data")
    p.add_argument("--distilled", type=Path, help="a distilled set (nat_kd.generate_distilled or nat_kd.mix output)")
    p.add_argument("--from-ranking", type=Path, metavar="RANKING_JSON",
                   help="nat_kd.choose's OUT/ranking.json: its corpus, best set, student and shape (instead of "
                        "--prepared, --distilled, --arch and --shape)")
    p.add_argument("--out", required=True, type=Path, help="the folder for the students' checkpoints")
    p.add_argument("--arch", help=f"the student, any kd_FAMILY_SIZE architecture (default {DEFAULT_ARCH})")
    p.add_argument("--shape", help="LAYERSxWIDTH over the architecture's sizes (default 2x128, the studies' "
                                   "students), or 'arch' for its own")
    p.add_argument("--updates", type=int, help="updates to train (default 2000, the profile's)")
    p.add_argument("--selection", choices=("ddrs", "per-token-min", "per-token-mean"), default="ddrs",
                   help="a set of several references a sentence (nat_kd.references): DDRS's annealed loss (the "
                        "default, CTC students), or each sentence on the reference of lowest loss per token, or on "
                        "all of them")
    return p


def main(argv=None) -> int:
    cli.setup_logging(argv)
    args = build_parser().parse_args(argv)

    def body():
        from nat_kd.engine.steps import student_family, student_shape
        from nat_kd.engine.training import STUDIES_SHAPE

        if args.updates is not None and args.updates < 1:
            raise SettingsError(f"--updates {args.updates}: give at least 1")
        if args.from_ranking:
            given = [f"--{name}" for name in ("prepared", "distilled", "arch", "shape") if getattr(args, name)]
            if given:
                raise SettingsError(f"--from-ranking takes the corpus, set, student and shape from the ranking: "
                                    f"drop {' '.join(given)}")
            chosen = from_ranking(args.from_ranking)
        elif not (args.prepared and args.distilled):
            raise SettingsError("give --prepared and --distilled, or --from-ranking")
        else:
            chosen = {"prepared": args.prepared, "distilled": args.distilled, "arch": args.arch or DEFAULT_ARCH,
                      "shape": args.shape or STUDIES_SHAPE, "best": None}
        corpus = PreparedCorpus(chosen["prepared"])
        tokenization, languages = corpus.tokenization(), corpus.language_pair()
        shape = student_shape(chosen["shape"])
        family = student_family(chosen["arch"])
        sets = [] if chosen["distilled"] is None else [(DistilledSet(chosen["distilled"]).bin,
                                                        DistilledSet(chosen["distilled"]).root.name)]
        sets.append((corpus.bin, REAL))
        kind = chosen["shape"] if shape is not None else "its own sizes"
        if chosen["best"] == REAL:
            print(f"# nat_kd.choose ranked the real data first: {chosen['arch']} ({kind}) on it")
        else:
            print(f"# {chosen['arch']} ({kind}) on {sets[0][1]}, and its twin on the real data; in a shell with the "
                  "project's .venv active (source .venv/bin/activate), train, then test:")
        meta = (DistilledSet(chosen["distilled"]).meta() or {}) if chosen["distilled"] else {}
        several = meta.get("references", {}).get("count")
        for bin_dir, name in sets:
            references = (several, args.selection) if several and name != REAL else None
            print("\n".join(student_commands(bin_dir, tokenization, languages, args.out / f"{family}.{name}",
                                             arch=chosen["arch"], shape=shape, updates=args.updates,
                                             references=references,
                                             selective_kd="selective_kd" in meta and name != REAL)))
        return 0

    return cli.run(body)


if __name__ == "__main__":
    raise SystemExit(main())
