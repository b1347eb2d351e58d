"""Command line: ``python -m nat_kd.study PROFILE_OR_CONFIG [--out DIR] [--jobs N] [--data-dir DIR | --corpus C.toml]
[--launcher local|slurm [--cluster CLUSTER.toml] [--detach] [--dry-run]]``.

Runs every step of the study that is not done yet (a killed study resumes where it stopped), then writes
the results folder: OUT/results/results.md (tables), *.png (figures), results.json, config.toml.
Per-step logs are in OUT/logs/, step records in OUT/steps/, models and data in OUT/work/.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from nat_kd.cli import add_verbose_argument, run, setup_logging
from nat_kd.errors import SettingsError
from nat_kd.machine import available_cores
from nat_kd.launch.arguments import add_launcher_arguments, check_launcher_arguments
from nat_kd.launch.settings import read_cluster_file
from nat_kd.launch.signals import submitit_warnings_once

from nat_kd.engine.cluster import JobLauncher, check_resources, dry_run, job_notes, run_stoppable, submit_detached
from .config import load, profile_names
from nat_kd.engine.curve import progress_note
from nat_kd.engine.devices import DEVICES, Devices
from nat_kd.engine.estimate import hours
from nat_kd.engine.runner import Runner, needed
from nat_kd.engine.store import PLACEHOLDER


def main(argv=None) -> int:
    setup_logging(argv, fmt="%(asctime)s | %(message)s")
    p = argparse.ArgumentParser(prog="python -m nat_kd.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help=f"a bundled profile ({', '.join(profile_names())}) or a TOML file")
    p.add_argument("--out", help="study folder (default: runs/study/NAME)")
    p.add_argument("--jobs", type=int, help="steps run at once (default: the config's [study] jobs)")
    p.add_argument("--threads", type=int, help="torch threads a step (default: the cores this process may use, "
                   "shared among the --jobs steps, so that a study of one step at a time trains on all of them)")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where the model jobs run: cpu, or cuda: each job on the GPU running the fewest of them, so "
                        "that --jobs N trains N at once on one GPU (default auto: cuda where torch sees a GPU); the "
                        "records name it, the fingerprints do not (a step trained on a GPU stands in for it on the CPU)")
    p.add_argument("--data-dir", help="raw Multi30k folder (default: $NAT_KD_DATA, else ../shared/data/multi30k)")
    p.add_argument("--corpus", metavar="CORPUS.toml", help="your own corpus instead of Multi30k: a TOML file with a "
                   "[corpus] section (and [study] src, tgt) that replaces the config's (docs/study.md)")
    p.add_argument("--reuse", metavar="DIR_OR_RESULTS_JSON", action="append", default=[],
                   help="an earlier study's folder (e.g. runs/study/kd-effect): its finished steps with the same "
                        "settings on the same inputs count as done here; or a committed study's results.json "
                        "(e.g. docs/results/capacity/results.json): its records count for the steps no other step "
                        "needs (students) whose inputs have the same digests (repeatable)")
    p.add_argument("--store", metavar="DIR", help="a folder kept under version control (e.g. docs/results/ladder): "
                   "each finished step's record and small outputs (distilled sets' targets, students' hypotheses; "
                   "never a checkpoint) are written there as it ends, and a step whose record there has the same "
                   "inputs is restored from it instead of run (docs/study.md, \"A study kept in git\")")
    p.add_argument("--hours", type=float, metavar="H",
                   help="start only the steps whose expected wall time fits in what is left of H hours, estimated "
                        "from the finished steps of the same kind and shape (this study's, its --store's, the "
                        "--reuse results'); the plan prints each step's estimate, and the run ends when no step "
                        "left fits (a running step is not stopped)")
    p.add_argument("--list", action="store_true", help="list the steps and whether each is done; run nothing")
    p.add_argument("--only", metavar="STEP", action="append", default=[],
                   help="run only this step and the steps it needs (repeatable; the names --list prints)")
    p.add_argument("--results-only", action="store_true",
                   help="rewrite the results folder from the step records there are; run nothing")
    add_launcher_arguments(
        p, 'docs/cluster.md, "The study on a cluster"',
        launcher="local (default): steps run here, --jobs at a time; slurm: each step a Slurm job (submitit), what "
                 "is ready submitted together up to [launcher] max_jobs; submitit-local: the same jobs as processes "
                 "on this machine",
        cluster="[launcher] (partition, account, ...) and [resources.KIND] tables over the config's",
        dry_run="print every job that would be submitted, with its resources and sbatch options; run nothing (needs "
                "no Slurm)",
        detach="slurm: submit every step that is not done at once, each job waiting in the queue for its "
               "dependencies' jobs (--dependency=afterok), and exit: the cluster runs the study without the driver "
               "(--list shows where it stands); submitit-local: on Ctrl-C or SIGTERM leave the jobs running (default: "
               "cancel them)")
    add_verbose_argument(p)
    args = p.parse_args(argv)
    return run(lambda: _study(args, argv), resumable=True)


RUN_OPTIONS = {"--only": True, "--hours": True, "--results-only": False}  # what runs now; True: takes a value


def study_command(argv: list[str], shown: dict[str, str] | None = None) -> str:
    """The command that runs the study: this run's arguments less those that choose what runs now (RUN_OPTIONS),
    since results.md describes the study, not one run of it; ``shown``: options whose value is written otherwise
    (the committed copy's ``--out DIR``)."""
    shown, kept, args = shown or {}, [], iter(argv)
    for arg in args:
        option, equals, _ = arg.partition("=")
        if option in RUN_OPTIONS or option in shown:
            if not equals and RUN_OPTIONS.get(option, True):
                next(args, None)  # the option's value
            kept += [option, shown[option]] if option in shown else []
        else:
            kept.append(arg)
    return "python -m nat_kd.study " + " ".join(shlex.quote(a) for a in kept)


def _study(args, argv) -> int:
    from nat_kd.engine.steps import settings_as_read  # imports fairseq
    from .plan import build_plan
    from .released_sets import path_in_checkout, write_sets_page
    from .results import write_results  # imports matplotlib

    check_launcher_arguments(args)
    if args.device != "auto" and args.launcher != "local":
        raise SettingsError(f"--device {args.device} is for the local launcher: a cluster job's GPUs are its "
                            "[resources.KIND] gpus (docs/cluster.md)")
    cfg = load(args.config, args.corpus)
    # absolute: the model jobs run in the checkout, wherever the study was started from
    out = Path(args.out or f"runs/study/{cfg.name}").resolve()
    steps = build_plan(cfg, out / "results", args.data_dir)
    cluster = cfg.cluster.over(read_cluster_file(args.cluster)) if args.cluster else cfg.cluster
    if args.launcher != "local" or args.dry_run:
        check_resources(cluster, steps, args.cluster or str(cfg.source))
    launcher = JobLauncher(out, args.launcher, cluster, args.detach) if args.launcher != "local" else None
    if launcher:
        submitit_warnings_once()
    jobs = args.jobs or cfg.jobs
    runner = Runner(out, jobs=jobs, threads=args.threads or max(1, available_cores() // jobs), launcher=launcher,
                    reuse=tuple(map(Path, args.reuse)), canonical=settings_as_read,
                    store=Path(args.store) if args.store else None, hours=args.hours,
                    devices=Devices(args.device) if args.launcher == "local" else None)
    if args.dry_run:
        planned = needed(steps, args.only) if args.only else steps
        for line in dry_run(planned, runner, cluster, detach=args.detach and args.launcher == "slurm"):
            print(line)
        return 0
    if args.list:
        states = runner.states(steps)
        jobs = job_notes(out, [s for s in steps if states[s.name] != "done"])
        for step in steps:
            state = states[step.name]
            note = progress_note(out / "work" / step.name) if state == "begun" else ""
            print(f"{state:6}  {step.name}" + (f"  ({note})" if note else "") + jobs.get(step.name, ""))
        return 0
    if args.detach and args.launcher == "slurm":  # the jobs chained in Slurm's queue; the driver's work is done
        return submit_detached(launcher, runner, needed(steps, args.only) if args.only else steps,
                               "python -m nat_kd.study ... --list shows where they stand")
    if args.results_only:
        records = runner.records(steps)
    else:
        planned = needed(steps, args.only) if args.only else steps
        if args.hours is not None:
            print(f"the plan in {args.hours:g} h, each step to run with its expected wall time:")
            for line in plan_estimates(runner, planned):
                print(line)
        records = run_stoppable(runner, planned, launcher)
        if args.only:  # the results show every step done, not only those run now (and no record of old inputs)
            records = runner.current_records(steps)
    given = argv or sys.argv[1:]
    command = study_command(given)
    states = runner.states(steps)
    pending = {s.name: progress_note(out / "work" / s.name) if states[s.name] == "begun" else ""
               for s in steps if s.name not in records}
    paths = write_results(cfg, records, out / "results", command, pending)
    if runner.store is not None:
        shown_store = path_in_checkout(runner.store.root, args.store)
        # a folder that lacks steps the store has (one set restored into a folder of your own) would replace the
        # committed results with fewer
        lacking = sorted(set(runner.store.records()) & {s.name for s in steps} - set(records))
        if lacking:
            print(f"the store's results/ left as they are: {len(lacking)} of the store's steps are not done in "
                  f"this folder ({', '.join(lacking[:3])}{', ...' if len(lacking) > 3 else ''})")
        else:
            committed = study_command(given, {"--out": PLACEHOLDER, "--store": shown_store, "--data-dir": "DATA_DIR"})
            runner.store.keep_results(paths["markdown"].parent, {
                command: committed, json.dumps(command)[1:-1]: json.dumps(committed)[1:-1],
                str(runner.store.root.resolve()): shown_store})
        page = write_sets_page(cfg, runner.store, args.store, args.config)
        if page is not None:
            print(f"the store's distilled sets: {page}")
    if args.results_only:
        print(f"{len(records)} of {len(steps)} steps done, none run; results: {paths['markdown']}")
    else:
        print(f"ran {len(runner.ran)} step(s), {len(runner.skipped)} already done; results: {paths['markdown']}")
    if runner.held:
        held = ", ".join(f"{name} ({hours(seconds)})" for name, seconds in runner.held.items())
        print(f"not started, for want of time within --hours {args.hours:g}: {held}; rerun to go on")
    return 0


WITHOUT_ESTIMATE = {"stored": "restored from the store", "reused": "a reused study's record"}  # run nothing


def plan_estimates(runner: Runner, steps) -> list[str]:
    """One line a step that is not done: its state, its name and its expected wall time (none for a step the
    store restores or a reused study's record stands in for). A dependency that has not run yet lends its
    planned settings: a set's rate goes by its teacher's shape, known before the teacher trains."""
    states, records, lines = runner.states(steps), runner.records(steps), []
    planned = {s.name: {"settings": s.settings} for s in steps}
    for step in steps:
        if states[step.name] in WITHOUT_ESTIMATE:
            lines.append(f"{states[step.name]:6}  {step.name}  {WITHOUT_ESTIMATE[states[step.name]]}")
        elif states[step.name] != "done":
            expected = runner.estimate(step, {d: records.get(d, planned[d]) for d in step.deps})
            lines.append(f"{states[step.name]:6}  {step.name}  {hours(expected)}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
