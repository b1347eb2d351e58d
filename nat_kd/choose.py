"""``python -m nat_kd.choose``: which candidate training set should *my* NAT student learn from?

Trains a short pilot of the student on each candidate set (``nat_kd.generate_distilled`` or ``nat_kd.mix``
output) and on the real data, ranks the sets by the pilots' validation BLEU, and puts beside each its data
measures (complexity, faithfulness, reordering, length) and how far pilots of that length agreed with full
training in the committed studies (``nat_kd.study.pilots``). The pilot is the first ``--updates`` updates of
the full recipe: the learning rate and the glancing schedule are those of a ``--final-updates`` run, so it
is the very start of the training it stands for.

Built on the study driver's steps (``nat_kd.study``): a killed run resumes where it stopped, a larger
``--updates`` continues the pilots of a smaller one, ``--jobs``
pilots run side by side, and ``--launcher slurm`` makes each pilot a cluster job. Writes OUT/ranking.md and
OUT/ranking.json; step records, logs and checkpoints go to OUT/steps, OUT/logs, OUT/work.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import sys
from dataclasses import asdict, dataclass
from itertools import zip_longest
from pathlib import Path

from nat_kd import atomic
from nat_kd.artifacts import BinarizedData, DistilledSet, PreparedCorpus
from nat_kd.cli import add_verbose_argument, run, setup_logging
from nat_kd.corpus import iter_lines
from nat_kd.engine.training import ARCH_SHAPE, STUDIES_SHAPE
from nat_kd.errors import SettingsError
from nat_kd.launch.arguments import add_launcher_arguments, check_launcher_arguments
from nat_kd.launch.settings import ClusterConfig, read_cluster_file
from nat_kd.launch.signals import submitit_warnings_once
from nat_kd.markdown import cell, table

# the full training a pilot stands for: the `students` and `capacity` profiles' student recipe
FINAL_UPDATES = 2000
# a set's name names its files in --out; the longest, steps/pilot.NAME.json's temporary name while it is written
# (atomic.py: .pilot.NAME.json.RANDOM.tmp.json), adds 30 bytes, and a file name holds 255
MAX_NAME = 255 - 30
REAL = "real"  # the ranking's name for the real data of --corpus
VALID = "valid"  # the split every pilot is measured on, with the corpus's references


@dataclass(frozen=True)
class ChooseConfig:
    """A choose run: the pilots' recipe and where they run. ``python -m nat_kd.choose`` is this, from the
    command line; a script calls ``choose(ChooseConfig(...))``."""
    corpus: Path  # a nat_kd.prepare output folder
    candidates: tuple[Path, ...]  # nat_kd.generate_distilled or nat_kd.mix output folders
    arch: str  # a kd_FAMILY_SIZE NAT architecture
    updates: int  # each pilot's budget
    out: Path
    shape: str = STUDIES_SHAPE  # LAYERSxWIDTH, or ARCH_SHAPE for the architecture's own sizes
    final_updates: int = FINAL_UPDATES
    max_tokens: int = 4096
    lr: float = 1e-3
    warmup: int = 200
    label_smoothing: float | None = None  # None: the family's default
    seed: int = 1
    jobs: int = 1
    threads: int = 1
    analysis: bool = True
    launcher: str = "local"  # local, slurm or submitit-local
    cluster: Path | None = None  # a cluster file ([launcher], [resources.KIND])
    detach: bool = False  # submitit-local: a stopped run leaves its jobs running (slurm: the CLI's --detach)


@dataclass
class Pilots:
    """A checked ChooseConfig as steps, with what the ranking needs."""
    config: ChooseConfig
    corpus: PreparedCorpus
    candidates: dict[str, DistilledSet]
    family: str
    steps: list
    cluster: ClusterConfig


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m nat_kd.choose", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, metavar="PREPARED",
                   help="the corpus the candidates re-decode: a nat_kd.prepare output folder")
    p.add_argument("--candidates", required=True, nargs="+", metavar="SET",
                   help="candidate training sets: nat_kd.generate_distilled or nat_kd.mix output folders, made in "
                        "the corpus's vocabulary (with a published teacher: --student-data PREPARED)")
    p.add_argument("--arch", required=True, help="the NAT student: a kd_FAMILY_SIZE architecture, e.g. kd_glat_tiny")
    p.add_argument("--updates", type=int, required=True,
                   help="each pilot's budget in updates; a larger one later continues the pilots where they "
                        "stopped, a smaller one trains them again")
    p.add_argument("--out", required=True,
                   help="the folder of the pilots and the ranking: a new one, or an earlier run's to go on with it")
    p.add_argument("--shape", default=STUDIES_SHAPE,
                   help=f"the student's LAYERSxWIDTH over its architecture's sizes (default {STUDIES_SHAPE}, the "
                        f"committed studies' students, whose pilots' agreement the ranking quotes), or "
                        f"'{ARCH_SHAPE}' for its own")
    p.add_argument("--final-updates", type=int, default=FINAL_UPDATES,
                   help=f"the full training the pilot stands for (default {FINAL_UPDATES}): glancing students "
                        "anneal over its first two thirds")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens a batch (default 4096)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup", type=int, default=200, help="warm-up updates, inverse square root (default 200)")
    p.add_argument("--label-smoothing", type=float,
                   help="(default 0.1; the families whose loss has none, CTC and DA-Transformer, take no other value "
                        "than 0)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="pilots trained at once (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads a pilot (default 1)")
    p.add_argument("--analysis", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the sets' complexity, faithfulness and reordering (default: on)")
    add_launcher_arguments(
        p, 'docs/cluster.md, "The study on a cluster"',
        launcher="local (default): the pilots run here, --jobs at a time; slurm: each a Slurm job (submitit); "
                 "submitit-local: the same jobs as processes on this machine",
        cluster="[launcher] (partition, account, ...) and [resources.KIND] tables (KIND: prepare, analysis, train)",
        dry_run="print every job that would be submitted; run nothing",
        detach="slurm: submit every step that is not done at once, each job waiting in the queue for its "
               "dependencies' jobs, and exit; the same command without --detach then waits for what is left and "
               "writes the ranking. submitit-local: on Ctrl-C or SIGTERM leave the jobs running (default: cancel "
               "them)")
    add_verbose_argument(p)
    return p.parse_args(argv)


def check_label_smoothing(given: float | None, arch: str, family: str) -> None:
    """--label-smoothing on a family whose loss sums over alignments and has none
    (fairseq_plugins.models.upsampling.refuse_label_smoothing): only 0, or the option left out."""
    from fairseq_plugins.models.nat import STUDENT_FAMILIES

    if given and not STUDENT_FAMILIES[family].label_smoothing:
        raise SettingsError(f"--label-smoothing {given:g}: {arch}'s loss has no label smoothing; leave the option "
                            "out (or give 0)")


def valid_split(data: BinarizedData, src: str, tgt: str) -> list[Path]:
    """The .bin/.idx files of the split every pilot is measured on."""
    return [f for f in data.split_files(src, tgt) if BinarizedData.split_of(f) == VALID]


def check_corpus(corpus: PreparedCorpus) -> None:
    """A prepared corpus with the validation split the pilots are measured on."""
    if corpus.manifest() is None:
        raise SettingsError(f"--corpus {corpus.root}: no manifest.json; give a nat_kd.prepare output folder, or "
                            f"{PreparedCorpus.HOW_TO_MAKE}")
    src, tgt = corpus.language_pair()
    if not (valid_split(corpus.bin, src, tgt) and corpus.raw(VALID, tgt).is_file()):
        raise SettingsError(f"--corpus {corpus.root} has no validation split ({corpus.raw(VALID, tgt)}, "
                            f"{corpus.bin.prefix(VALID, src, tgt, tgt)}.bin): each pilot is measured on it; prepare "
                            "the corpus with --validpref")


def check_candidate(folder: Path, corpus: PreparedCorpus) -> DistilledSet:
    """A finished set that re-decodes the corpus's training sources, in the corpus's vocabulary."""
    candidate, (src, tgt) = DistilledSet(folder), corpus.language_pair()
    if not folder.is_dir():
        if candidate.progress_dir.is_dir():  # the set's folder appears only once it is complete
            raise SettingsError(f"--candidates {folder}: no such folder: its nat_kd.generate_distilled was "
                                f"interrupted ({candidate.progress_dir} holds what it decoded); run its command "
                                "again to finish it")
        raise SettingsError(f"--candidates {folder}: no such folder; give the --out folder of "
                            "nat_kd.generate_distilled or nat_kd.mix")
    meta = candidate.meta()
    if meta is None:
        if PreparedCorpus(folder).manifest_file.is_file():
            raise SettingsError(f"--candidates {folder} is a prepared corpus (nat_kd.prepare output), not a set: "
                                f"the real data of --corpus is always ranked, as '{REAL}'; give distilled sets only")
        sets = sorted(d.name for d in folder.iterdir() if DistilledSet(d).meta_file.is_file())
        if sets:
            raise SettingsError(f"--candidates {folder} holds the sets {', '.join(sets)} and is none itself: give "
                                f"them one by one (--candidates {' '.join(str(folder / s) for s in sets)})")
        raise SettingsError(f"{folder}: no meta.json: not a finished nat_kd.generate_distilled or nat_kd.mix set")
    direction = meta.get("source_lang", src), meta.get("target_lang", tgt)
    if direction != (src, tgt):
        raise SettingsError(f"{folder}: a set of {'-'.join(direction)} ({candidate.meta_file}), the corpus is "
                            f"{src}-{tgt}: a candidate re-decodes the corpus's sources into its targets")
    if meta.get("split", "train") != "train":
        raise SettingsError(f"{folder}: a set of the {meta['split']} split ({candidate.meta_file}): a candidate "
                            "re-decodes the corpus's training split (generate_distilled --split train)")
    theirs, ours = candidate.text("train", src), corpus.raw("train", src)
    for number, (a, b) in enumerate(zip_longest(iter_lines(theirs), iter_lines(ours)), 1):
        if a is None or b is None:
            raise SettingsError(f"{theirs}:{number}: {'fewer' if a is None else 'more'} lines than {ours} (one of "
                                f"them ends before line {number}): a candidate re-decodes this corpus's whole "
                                "training split")
        if a != b:
            raise SettingsError(f"{theirs}:{number}: the source differs from {ours}:{number}: a candidate "
                                f"re-decodes this corpus's training sources (generate_distilled --prepared "
                                f"{corpus.root})")
    for lang in (src, tgt):
        mine, real = candidate.bin.dictionary(lang), corpus.bin.dictionary(lang)
        if not mine.is_file() or not filecmp.cmp(mine, real, shallow=False):
            raise SettingsError(f"{mine} is not {real}: the set is in another vocabulary (its teacher's); make it "
                                f"in the student's with generate_distilled --student-data {corpus.root}")
    # the pilot validates on the set's bin/ (fairseq-train reads one folder) and is scored against the corpus's
    # raw references: the validation split of another preparation of the corpus would score it on other sentences
    remake = (f"make the set from this corpus (generate_distilled --prepared {corpus.root}, or --student-data "
              f"{corpus.root} with a published teacher)")
    for real in valid_split(corpus.bin, src, tgt):
        mine = candidate.bin.root / real.name
        if not mine.is_file():
            raise SettingsError(f"{mine}: no such file: the set's bin/ has no validation split (it was made from "
                                f"text), and its pilot is measured on the corpus's; {remake}")
        if not filecmp.cmp(mine, real, shallow=False):
            raise SettingsError(f"{mine} is not {real}: the set was made from another preparation of the corpus, "
                                f"with another validation split, and its pilot would be scored on other sentences; "
                                f"{remake}")
    return candidate


# what choose writes in --out: the Runner's folders (each entry named after a step, with its suffix), the
# launcher's, the analysis and the ranking
STEP_FOLDERS = {"steps": ".json", "work": "", "logs": ".log", "jobs": ""}
OUT_ENTRIES = {*STEP_FOLDERS, "analysis", "ranking.md", "ranking.json"}


def is_choose_step(name: str) -> bool:
    return name in ("prepare", "analysis") or name.startswith(("set.", "pilot."))


def check_out(out: Path) -> None:
    """Refuse an --out that holds what choose did not write (hidden files aside): a step's work folder begun
    with other inputs is wiped and its record replaced, so in a study's folder, whose steps prepare and
    analysis are choose's too, the study would lose its prepared corpus and every record after it."""
    atomic.check_output_folder(out)
    if not out.is_dir():
        return
    for entry in sorted(out.iterdir()):
        if entry.name.startswith("."):
            continue
        foreign = entry if entry.name not in OUT_ENTRIES else None
        if entry.name in STEP_FOLDERS and entry.is_dir():
            suffix = STEP_FOLDERS[entry.name]
            foreign = next((e for e in sorted(entry.iterdir()) if not e.name.startswith(".")
                            and not (e.name.endswith(suffix) and is_choose_step(e.name.removesuffix(suffix)))), None)
        if foreign is not None:
            raise SettingsError(f"--out {out} holds {foreign}, which choose does not write (a study's or a set's "
                                "folder?); choose wipes what a step began with other inputs: give a new folder, or "
                                "an earlier choose's --out to go on with it")


def candidate_step(ctx, *, name: str, folder: str, tgt: str) -> dict:
    """A candidate set as the analysis and the pilots read it (what the study's distil steps return); its
    target text is its output, so a changed set trains its pilot again."""
    candidate = DistilledSet(folder)
    meta = candidate.meta()
    return {"dir": folder, "name": name, "strategy": meta["strategy"], "outputs": [str(candidate.text("train", tgt))],
            "sentences": meta["sentences"]}


def build_steps(config: ChooseConfig, corpus: PreparedCorpus, candidates: dict[str, DistilledSet], family: str,
                out: Path) -> list:
    from functools import partial

    from nat_kd.engine.training import Training
    from nat_kd.engine.steps import analysis_step, family_recipe, prepare_step, student_shape, train_step
    from nat_kd.engine.runner import Step

    src, tgt = corpus.language_pair()
    manifest = corpus.manifest() or {}
    # absolute: fairseq's jobs run in the checkout (fairseq_jobs.ROOT), wherever choose was started from.
    # The corpus and the sets are prepared already: their steps read their records, in the driver.
    steps = [Step("prepare", "prepare", {"corpus": manifest.get("fingerprint")},
                  partial(prepare_step, src=src, tgt=tgt, vocab_size=0, train_limit=None, data_dir=None,
                          corpus=manifest.get("fingerprint"), own={"prepared": str(corpus.root.resolve())}),
                  in_driver=True)]
    for name, candidate in candidates.items():
        steps.append(Step(f"set.{name}", "prepare", {"name": name},
                          partial(candidate_step, name=name, folder=str(candidate.root.resolve()), tgt=tgt),
                          in_driver=True))
    sets = [f"set.{name}" for name in candidates]
    if config.analysis:
        from nat_kd.study.config import ANALYSIS_DEFAULTS

        steps.append(Step("analysis", "analysis", {"sets": sets, "details": ANALYSIS_DEFAULTS},
                          partial(analysis_step, prepare="prepare", sets=sets, src=src, tgt=tgt,
                                  out=str(out / "analysis"), details=ANALYSIS_DEFAULTS), ["prepare", *sets]))
    # the final run's length reaches a pilot only through its glancing schedule, and a family without glancing
    # has none (Training.used_by): its pilots stay done whatever --final-updates says
    smoothing = {} if config.label_smoothing is None else {"label_smoothing": config.label_smoothing}
    training = Training(updates=config.updates, max_tokens=config.max_tokens, lr=config.lr, warmup=config.warmup,
                        bleu_every=config.updates, glance_anneal_updates=round(config.final_updates * 2 / 3),
                        **smoothing).used_by(family)
    evaluation = {"beam": 1, "max_tokens": 8192, "max_len_a": 0.0, "max_len_b": 200, "splits": [VALID]}
    shape = student_shape(config.shape)
    shape = None if shape is None else asdict(shape)
    for name, data in [(REAL, None), *((name, f"set.{name}") for name in candidates)]:
        settings = dict(prepare="prepare", data=data, arch=config.arch, shape=shape, training=asdict(training),
                        nat_family=family, evaluation=evaluation, tgt=tgt, seed=config.seed,
                        **family_recipe(family))
        # the budget is both keys (one measurement, at the pilot's end): a longer --updates continues the pilots
        steps.append(Step(f"pilot.{name}", "train", settings, partial(train_step, **settings),
                          ["prepare"] + ([data] if data else []), budget=("updates", "bleu_every")))
    return steps


def ranking(records: dict, candidates: list[str], family: str, shape: str, updates: int) -> dict:
    """The sets by their pilot's validation BLEU, best first, with their data measures and the agreement
    of this family's pilots at this shape (LAYERSxWIDTH) with full training in the committed studies."""
    from nat_kd.analysis.metrics import shown
    from nat_kd.analysis.metrics.base import RANKING
    from nat_kd.engine.curve import bleu_at
    from nat_kd.study.pilots import for_family, noise_for, trusted_budget

    analysis = {row["name"]: row for row in records.get("analysis", {}).get("result", {}).get("rows", [])}
    rows = []
    for name in [REAL, *candidates]:
        curve = records[f"pilot.{name}"]["result"]["curve"]  # a continued pilot's holds its shorter budgets
        rows.append({"set": name, "valid_bleu": bleu_at(curve, updates),
                     **{m.name: analysis.get(name, {}).get(m.name) for m, _ in shown(RANKING)}})
    rows.sort(key=lambda r: -r["valid_bleu"])
    agreement, measured = for_family(family, shape, updates)
    return {"family": family, "shape_label": shape, "updates": updates, "rows": rows, "agreement": agreement,
            "measured_updates": measured, "trusted_updates": trusted_budget(family, shape),
            "noise": noise_for(family, shape, updates)}


def verdict(rank: dict) -> str:
    """One line, distrust first: pilots that have not learned yet (best validation BLEU below
    pilots.LEARNED_BLEU) should run longer; pilots of a length whose committed pilots did not pick the final
    best set are not to be trusted yet; only then is a leader within the pilots' seed noise a draw, and a
    ranking trusted as far as the committed studies measured (pilots.picked_the_best)."""
    from nat_kd.study.pilots import LEARNED_BLEU, picked_the_best

    who = f"{rank['family']} pilots at {rank['shape_label']}"
    trusted, agreement, noise, rows = rank["trusted_updates"], rank["agreement"], rank["noise"], rank["rows"]
    first = (f"they first picked the final best at {trusted:,} updates" if trusted else
             "at no budget measured did they pick the final best in every study")
    best = rows[0]["valid_bleu"]
    if best < LEARNED_BLEU:
        longer = (f"at least {trusted:,} updates, where {who} first picked the final best in every committed study"
                  if trusted and trusted > rank["updates"] else f"at least {2 * rank['updates']:,} updates, then "
                  "choose again")
        return (f"Verdict: pilot longer: these pilots have not learned yet. The best reached validation BLEU "
                f"{best:.2f}, below {LEARNED_BLEU:g}, where every student of the committed studies still at least "
                f"doubled it over the next 250 updates: their order is how fast they got off the ground, not the "
                f"sets'. Pilot {longer}.")
    if agreement and not picked_the_best(agreement):
        missed = "; ".join(f"{r['study']}: picked {r['pick']}, {r['regret']:.2f} test BLEU below the final best"
                           for r in agreement if r["regret"] != 0)
        return (f"Verdict: do not trust this ranking yet. {who} of {max(r['updates'] for r in agreement):,} updates "
                f"did not rank the sets as full training did ({missed}); {first}.")
    if noise and len(rows) > 1 and best - rows[1]["valid_bleu"] < noise["sd"]:
        return (f"Verdict: a draw at the top. {rows[0]['set']} leads {rows[1]['set']} by "
                f"{best - rows[1]['valid_bleu']:.2f} BLEU, less than the seed alone moves {who} of "
                f"{noise['updates']:,} updates in the committed studies (sd {noise['sd']:.2f} over {noise['sets']} "
                "sets): train both in full, or pilot longer.")
    if not rank["measured_updates"]:
        return (f"Verdict: untested. No committed study measured how {who} rank training sets: treat this ranking "
                "as a pilot's, nothing more.")
    if not agreement:
        return (f"Verdict: untested this short. {who} were measured from {rank['measured_updates'][0]:,} updates "
                f"on; {first}.")
    studies = ", ".join(f"{r['study']} ({r['sets']} sets)" for r in agreement)
    return (f"Verdict: trusted as far as measured. {who} of {max(r['updates'] for r in agreement):,} updates "
            f"picked the final best set in {studies}.")


def render(rank: dict, arch: str) -> str:
    from nat_kd.analysis.metrics import shown
    from nat_kd.analysis.metrics.base import RANKING

    scores, measures = [r["valid_bleu"] for r in rank["rows"]], shown(RANKING)
    # equal scores share a rank (1, 1, 3): their order, the real data first, then the sets as given, is no finding
    body = [[1 + sum(s > r["valid_bleu"] for s in scores), r["set"], cell(r["valid_bleu"], ".2f"),
             "best" if r["valid_bleu"] == scores[0] else f"{r['valid_bleu'] - scores[0]:+.2f}"]
            + [cell(r.get(m.name), column.format) for m, column in measures] for r in rank["rows"]]
    parts = [f"# Which training set for {arch} at {rank['shape_label']}? Pilots of {rank['updates']:,} updates\n",
             verdict(rank) + "\n",
             table(["rank", "training set", "pilot valid BLEU", "gap"] + [column.label for _, column in measures],
                   body),
             "Pilot valid BLEU: sacrebleu on the detokenized validation set after the pilot's last update. Data "
             "measures: nat_kd.analyze report (13a, lowercased), each set against the real data.\n",
             "## How far pilots this short can be trusted\n"]
    agreement, measured = rank["agreement"], rank["measured_updates"]
    if not measured:
        parts.append(f"Not measured: no committed study trained {rank['family']} students at {rank['shape_label']} on "
                     "enough sets with a learning curve (docs/results/capacity/).\n")
    elif not agreement:
        parts.append(f"Not measured this short: {rank['family']} pilots at {rank['shape_label']} were measured at "
                     f"{', '.join(f'{u:,}' for u in measured)} updates (docs/results/capacity/).\n")
    else:
        from nat_kd.study.pilots import markdown

        parts += [f"Pilots of {rank['family']} in the committed studies, at the longest budget up to "
                  f"{rank['updates']:,} updates, against the final test BLEU of full training "
                  "(docs/results/capacity/):\n", markdown(agreement)]
    return "\n".join(parts)


def main(argv=None) -> int:
    setup_logging(argv)
    args = parse_args(argv)
    return run(lambda: _choose(args), resumable=True)


def config_of(args) -> ChooseConfig:
    return ChooseConfig(corpus=Path(args.corpus), candidates=tuple(map(Path, args.candidates)), arch=args.arch,
                        updates=args.updates, out=Path(args.out), shape=args.shape,
                        final_updates=args.final_updates, max_tokens=args.max_tokens, lr=args.lr,
                        warmup=args.warmup, label_smoothing=args.label_smoothing, seed=args.seed, jobs=args.jobs,
                        threads=args.threads, analysis=args.analysis, launcher=args.launcher,
                        cluster=Path(args.cluster) if args.cluster else None, detach=args.detach)


def _choose(args) -> int:
    from nat_kd.engine.cluster import dry_run, submit_detached

    check_launcher_arguments(args)
    config = config_of(args)
    if args.dry_run or (config.detach and config.launcher == "slurm"):
        pilots = plan_pilots(config)
        runner, launcher = _runner(pilots)
        if args.dry_run:
            detach = config.detach and config.launcher == "slurm"
            print("\n".join(dry_run(pilots.steps, runner, pilots.cluster, detach=detach)))
            return 0
        # the pilots chained in Slurm's queue; the same command without --detach collects them
        return submit_detached(launcher, runner, pilots.steps, "run the same command without --detach once they "
                               "have run: it waits for what is left and writes the ranking")
    choose(config)
    print((config.out / "ranking.md").read_text(), end="")
    return 0


def plan_pilots(config: ChooseConfig) -> Pilots:
    """Check the settings, the corpus, the candidates and --out (a SettingsError naming what to fix), and make
    the steps: the corpus, each set, their analysis and a pilot a set."""
    from nat_kd.engine.cluster import check_resources
    from nat_kd.engine.steps import student_family, student_shape

    if config.updates < 1 or config.final_updates < config.updates:
        raise SettingsError(f"--updates {config.updates} --final-updates {config.final_updates}: give 1 <= "
                            "--updates <= --final-updates")
    family = student_family(config.arch)
    student_shape(config.shape)  # a wrong --shape before anything runs
    check_label_smoothing(config.label_smoothing, config.arch, family)
    corpus = PreparedCorpus(config.corpus)
    check_corpus(corpus)
    candidates = {}
    for folder in config.candidates:
        name = folder.resolve().name
        if name in candidates and candidates[name].root.resolve() == folder.resolve():
            raise SettingsError(f"--candidates {folder}: given twice; give each set once")
        if len(os.fsencode(name)) > MAX_NAME:
            raise SettingsError(f"--candidates {folder}: its name is {len(os.fsencode(name))} bytes long; it names "
                                f"the set's files in --out, which allow it {MAX_NAME}: rename the folder")
        if name in candidates or name == REAL:
            raise SettingsError(f"{folder}: a second candidate named '{name}'; the folder's name names the set "
                                f"(and '{REAL}' the real data): rename one")
        candidates[name] = check_candidate(folder, corpus)
    out = config.out.resolve()
    check_out(out)
    steps = build_steps(config, corpus, candidates, family, out)
    cluster = read_cluster_file(config.cluster) if config.cluster else ClusterConfig()
    if config.launcher != "local" or config.cluster:
        check_resources(cluster, steps, str(config.cluster or "--cluster"))
    return Pilots(config, corpus, candidates, family, steps, cluster)


def _runner(pilots: Pilots):
    from nat_kd.engine.cluster import JobLauncher
    from nat_kd.engine.runner import Runner

    config, launcher = pilots.config, None
    if config.launcher != "local":
        launcher = JobLauncher(config.out.resolve(), config.launcher, pilots.cluster, config.detach)
        submitit_warnings_once()
    return Runner(config.out.resolve(), jobs=config.jobs, threads=config.threads, launcher=launcher), launcher


def choose(config: ChooseConfig) -> dict:
    """Train the pilots of ``config`` (what an earlier run with its --out finished is kept, a longer budget
    continues them), rank the sets, write OUT/ranking.md and OUT/ranking.json and return the ranking (what
    ranking.json holds)."""
    from nat_kd.engine.cluster import run_stoppable

    pilots = plan_pilots(config)
    runner, launcher = _runner(pilots)
    return _rank(pilots, run_stoppable(runner, pilots.steps, launcher))


def _rank(pilots: Pilots, records: dict) -> dict:
    from nat_kd.engine.steps import shape_label, student_shape

    config = pilots.config
    # what next_steps --from-ranking reads: the student piloted, its --shape, and where each set is
    rank = {**ranking(records, list(pilots.candidates), pilots.family,
                      shape_label(config.arch, student_shape(config.shape)), config.updates),
            "arch": config.arch, "shape": config.shape, "corpus": str(pilots.corpus.root.resolve()),
            "sets": {name: str(candidate.root.resolve()) for name, candidate in pilots.candidates.items()}}
    out = config.out.resolve()
    atomic.write_json(out / "ranking.json", rank)
    atomic.write_text(out / "ranking.md", render(rank, config.arch))
    return rank


if __name__ == "__main__":
    sys.exit(main())
