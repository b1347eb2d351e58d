"""A small make: steps with dependencies, each skipped when its inputs have not changed since it finished.

A step's fingerprint hashes its kind, its settings and the fingerprints and output digests of the steps it
depends on, so a changed setting redoes that step and everything downstream, and nothing else. A finished
step leaves ``steps/NAME.json`` (fingerprint, result, wall time); its working folder ``work/NAME`` is wiped
when the fingerprint changes, and kept otherwise, so a killed fairseq-train resumes from its last checkpoint;
a training step's folder is also kept when only its budget grew, so a longer training continues the shorter.
Independent steps run side by side (``jobs`` at a time), each with ``threads`` torch threads (the driver
shares the cores among the jobs: on a small CPU machine two single-threaded jobs get more done than one job
with two threads, and one job alone takes them all). With a launcher (cluster.py) each
step is a cluster job instead, running the same ``execute``.
"""
from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nat_kd import atomic
from nat_kd.errors import NatKdError
from nat_kd.hashing import sha256_files, sha256_json
from nat_kd.launch.settings import Resources
from nat_kd.machine import hardware

from .devices import CPU, Devices
from .estimate import Estimates
from .store import Kept, Store

logger = logging.getLogger("nat_kd.study")
# Bump when a change to the steps' code makes old results invalid.
STEP_VERSION = 1


class StepError(NatKdError):
    """A step failed; the message names the step and its log."""


@dataclass
class Step:
    name: str
    kind: str
    settings: dict
    run: Callable[["StepContext"], dict]  # returns the step's result (JSON-able), incl. "outputs": [paths]
    deps: list[str] = field(default_factory=list)
    # a training's budget: the keys of settings["training"] that may change while its work folder is kept, as
    # long as "updates" does not shrink, so a longer budget continues from the last checkpoint
    budget: tuple[str, ...] = ()
    # bookkeeping (reading a prepared folder's records: no model, no decoding): the driver runs it itself on
    # any launcher, so no cluster job waits in the queue for seconds of work; it needs only steps like it
    in_driver: bool = False
    # what a store (nat_kd.engine.store) keeps of the finished step, from its work folder and result (a training
    # keeps its hypotheses, never its checkpoint); None: the step is never restored, it runs (the corpus, a mix:
    # made again in seconds); and how the files Kept.rebuilt are made again in a restored work folder, from the
    # dependencies' results
    keep: Callable[[Path, dict], Kept] | None = None
    rebuild: Callable[[Path, dict], None] | None = None


def in_dependency_order(steps: list[Step]) -> list[Step]:
    """The steps each after the steps it reads, otherwise in their given order (a profile lists a Selective KD
    mix with the mixes, before the student that evaluates it): one pass over them then meets every step's
    dependencies first, as --list, --hours and a cluster's submission do. Steps that wait on each other (a
    cycle) or on a step not in the list keep their order at the end, for run to name."""
    placed, ordered, pending = set(), [], list(steps)
    while pending:
        step = next((s for s in pending if all(d in placed for d in s.deps)), None)
        if step is None:
            return ordered + pending
        placed.add(step.name)
        ordered.append(step)
        pending.remove(step)
    return ordered


def needed(steps: list[Step], names: list[str]) -> list[Step]:
    """The named steps and every step they depend on, in plan order (``--only``)."""
    by_name = {s.name: s for s in steps}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise StepError(f"--only {unknown[0]}: no such step in this study's plan (--list names them)")
    keep, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo.extend(by_name[name].deps)
    return [s for s in steps if s.name in keep]


@dataclass
class StepContext:
    step: Step
    work: Path  # the step's own folder
    log: Path  # its log file (fairseq's output goes here)
    results: dict  # name -> result of every finished step (its dependencies included)
    threads: int
    job: Resources | None = None  # what a cluster job was given (None: a local run)
    device: str | None = None  # a local run's: "cpu" or "cuda:N" (nat_kd.engine.devices); None: the job's own

    @property
    def gpus(self) -> int:
        """The cluster job's GPUs (0: fairseq uses what it sees, as on one machine)."""
        return self.job.gpus if self.job else 0

    @property
    def fp16(self) -> bool:
        return bool(self.job and self.job.fp16)

    @property
    def save_updates(self) -> int:
        """fairseq-train's --save-interval-updates (0: none; a run then saves at its end, and at each epoch's end
        unless it is a learning curve's chunk: fairseq_jobs.train)."""
        return self.job.save_updates if self.job else 0


FINGERPRINT = ".fingerprint"  # in a step's work folder: the inputs it was begun with
RECIPE = ".recipe.json"  # in a budgeted step's work folder: its inputs but the budget, and the updates asked for
WALL = ".wall.json"  # in a step's work folder: the wall time of its runs so far


class StepClock:
    """A step's wall time over all its runs: a killed or failed step resumes with the time its earlier runs
    spent, which each run keeps in the work folder's .wall.json, rewritten every ``heartbeat`` seconds and at
    its end, so a run killed outright loses at most that much. A work folder wiped for new inputs starts at
    zero."""

    def __init__(self, work: Path, heartbeat: float = 60.0):
        self.path, self.heartbeat = work / WALL, heartbeat
        earlier = json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else {}
        self.earlier, self.runs = earlier.get("seconds", 0.0), earlier.get("runs", 0) + 1
        self._stop = threading.Event()

    @property
    def seconds(self) -> float:
        return self.earlier + (self._ended or time.perf_counter()) - self._started

    def _save(self) -> None:
        atomic.write_json(self.path, {"seconds": round(self.seconds, 1), "runs": self.runs})

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            self._save()

    def __enter__(self) -> "StepClock":
        self._started, self._ended = time.perf_counter(), None
        self._save()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._ended = time.perf_counter()
        self._save()


def step_fingerprint(step: Step, records: dict, settings: dict | None = None) -> str:
    """The step's inputs: its kind, its ``settings`` (default: its own) and its dependencies' ``records``."""
    upstream = [(d, records[d]["fingerprint"], records[d]["digest"]) for d in sorted(step.deps)]
    return sha256_json({"version": STEP_VERSION, "kind": step.kind,
                        "settings": step.settings if settings is None else settings, "upstream": upstream})


def step_recipe(step: Step, records: dict) -> dict | None:
    """A budgeted step's fingerprint without its budget, and the updates it asks for; None without one."""
    if not step.budget:
        return None
    training = step.settings["training"]
    settings = step.settings | {"training": {k: v for k, v in training.items() if k not in step.budget}}
    return {"fingerprint": step_fingerprint(step, records, settings), "updates": training["updates"]}


def inputs_key(kind: str, settings: dict, digests: dict[str, str]) -> str:
    """A step's inputs by content: its kind, its settings, and its dependencies' output digests, each
    dependency's name (where the settings name it) replaced by its digest, so that a step of another study
    with other step names but byte-identical inputs has the same key. Unlike the fingerprint, it does not
    chain the dependencies' own inputs: a teacher retrained to the same beam set counts as the same input."""

    def by_content(value):
        if isinstance(value, str) and value in digests:
            return {"digest": digests[value]}
        if isinstance(value, dict):
            return {k: by_content(v) for k, v in value.items()}
        if isinstance(value, list):
            return [by_content(v) for v in value]
        return value

    return sha256_json({"version": STEP_VERSION, "kind": kind, "settings": by_content(settings),
                        "inputs": sorted(digests.values())})


class ReusedRecords:
    """The records of a results.json (a study whose folder is gone), by their inputs' key (``inputs_key``)."""

    def __init__(self, path: Path, canonical: Callable[[str, dict], dict]):
        self.path = path
        try:
            steps = json.loads(path.read_text(encoding="utf-8"))["steps"]
        except (OSError, ValueError, KeyError, TypeError):
            raise StepError(f"--reuse {path}: not a study's results.json (no \"steps\" in it); give a study's "
                            "results/results.json or its folder") from None
        self.steps, self.by_key = steps, {}
        for record in steps.values():
            digests = {d: steps[d]["digest"] for d in record.get("deps", []) if d in steps}
            if len(digests) == len(record.get("deps", [])):
                key = inputs_key(record["kind"], canonical(record["kind"], record["settings"]), digests)
                self.by_key.setdefault(key, record)

    def find(self, key: str) -> dict | None:
        found = self.by_key.get(key)
        return json.loads(json.dumps(found)) if found is not None else None


def begun_with(work: Path, fingerprint: str, recipe: dict | None = None) -> bool:
    """Whether the step's work folder was begun with these inputs (so a run resumes what is there), or, for
    a budgeted step (``recipe``: step_recipe), with the same inputs but a budget of no more updates (so a
    run continues it)."""
    marker, kept = work / FINGERPRINT, work / RECIPE
    if marker.is_file() and marker.read_text() == fingerprint:
        return True
    if recipe is None or not kept.is_file():
        return False
    begun = json.loads(kept.read_text(encoding="utf-8"))
    return begun["fingerprint"] == recipe["fingerprint"] and begun["updates"] <= recipe["updates"]


def execute(root: Path, step: Step, fingerprint: str, results: dict, *, jobs: int, threads: int,
            job: Resources | None = None, extra: dict | None = None, recipe: dict | None = None,
            device: str | None = None) -> dict:
    """Run one step in ``root``'s work/NAME and write its record steps/NAME.json; returns the record.

    A module-level function of picklable arguments: the driver runs it in a thread, a cluster job
    (nat_kd.engine.cluster) in its own process, and either way the record is written by the step's own run,
    so a job whose driver has gone leaves its result where the next run finds it. ``extra`` goes into the
    record (the job's id); ``recipe`` (step_recipe) lets a budgeted step continue a shorter run; ``device``: where
    a local run's model jobs go (None: a cluster job's, on its GPUs if it has any)."""
    root = Path(root)
    work = root / "work" / step.name
    if work.exists() and not begun_with(work, fingerprint, recipe):
        shutil.rmtree(work)  # made with other inputs: a resumed fairseq-train would continue the wrong run
    work.mkdir(parents=True, exist_ok=True)
    (work / FINGERPRINT).write_text(fingerprint)
    if recipe is not None:
        atomic.write_json(work / RECIPE, recipe)
    log = root / "logs" / f"{step.name}.log"
    log.parent.mkdir(exist_ok=True)
    context = StepContext(step, work, log, results, threads, job, device)
    try:
        with StepClock(work) as clock:
            result = step.run(context)
    except Exception as err:
        raise StepError(f"step {step.name} failed: {type(err).__name__}: {err}\n  log: {log}") from err
    record = {"name": step.name, "kind": step.kind, "settings": step.settings, "deps": step.deps,
              "fingerprint": fingerprint, "digest": sha256_files(result.get("outputs", [])),
              # every run's time, a resumed step's earlier runs included
              "wall_seconds": round(clock.seconds, 1), "runs": clock.runs,
              "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
              # what the wall time was measured under (--jobs and --threads may override the config's)
              "jobs": jobs, "threads": threads, "device": device or ("cuda" if context.gpus else CPU),
              "hardware": hardware(), **(extra or {}), "result": result}
    atomic.write_json(root / "steps" / f"{step.name}.json", record)
    return record


class Runner:
    def __init__(self, root: Path, jobs: int = 1, threads: int = 1, launcher=None, reuse: tuple[Path, ...] = (),
                 canonical: Callable[[str, dict], dict] | None = None, store: Path | None = None,
                 hours: float | None = None, devices: Devices | None = None):
        """``launcher``: None runs the steps in this process's threads, ``jobs`` at a time; a
        nat_kd.engine.cluster.JobLauncher submits each as a job instead, up to its own limit. ``reuse``: other
        study folders whose finished steps stand in for this study's own when their fingerprints match (the
        same settings on the same inputs): the record is copied, the outputs stay there; or the results.json of
        a study whose folder is gone (a committed results page): its records stand in for the steps that no
        other step needs, where their settings and their inputs' digests match (``ReusedRecords``);
        ``canonical(kind, settings)``: the settings as the step's work reads them, for that match. ``store``: a
        folder kept under version control (nat_kd.engine.store) into which every finished step's record and
        small outputs go, and from which a step with the same inputs is restored instead of run. ``hours``:
        start only the steps whose expected wall time (nat_kd.engine.estimate) fits in what is left of them;
        the others are left in ``held``, with their estimates. ``devices``: where the local jobs run (default:
        the GPUs torch sees, else the CPU)."""
        self.root, self.jobs, self.threads, self.launcher = Path(root), max(1, jobs), threads, launcher
        self.reuse = [Path(r) for r in reuse if not Path(r).is_file()]
        self.canonical = canonical or (lambda kind, settings: settings)
        self.reused_records = [ReusedRecords(Path(r), self.canonical) for r in reuse if Path(r).is_file()]
        for other in self.reuse:  # a study whose first step is still running has no steps/ yet
            if not any((other / folder).is_dir() for folder in ("steps", "work", "logs")):
                raise StepError(f"--reuse {other}: not a study folder (no steps/, work/ or logs/ in it) nor a "
                                "results.json; give the --out of an earlier study, e.g. runs/study/kd-effect, or "
                                "a committed study's results.json")
        # made by the first step that runs: --list and --dry-run leave a mistyped --out uncreated
        self.records_dir, self.work_dir = self.root / "steps", self.root / "work"
        self.store = Store(store, self.root) if store else None
        self.devices = devices or Devices()
        self.deadline = time.monotonic() + hours * 3600 if hours is not None else None
        self.held: dict[str, float | None] = {}  # steps not started for want of time: their estimates
        self._estimates: Estimates | None = None
        # steps restored from the store without their outputs (a checkpoint) that a step still to run reads:
        # they run again
        self._outputs_needed: set[str] = set()
        self.ran: list[str] = []  # steps run this time (the others were up to date)
        self.skipped: list[str] = []
        self._needed: set[str] = set()  # the steps other steps of the plan depend on (set by run and states)

    def _record(self, name: str, fingerprint: str | None = None, step: Step | None = None,
                records: dict | None = None) -> dict | None:
        """The step's record here; with ``fingerprint``, when this study's is not up to date, a record of a
        ``reuse`` folder that is, copied here first; failing that, for a ``step`` no other step needs, a record
        of a reused results.json whose inputs match (``records``: its dependencies' records here)."""
        path = self.records_dir / f"{name}.json"
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        if fingerprint is None or self._up_to_date(name, record, fingerprint):
            return record
        for other in self.reuse:
            theirs = other / "steps" / f"{name}.json"
            found = json.loads(theirs.read_text(encoding="utf-8")) if theirs.is_file() else None
            if self._up_to_date(name, found, fingerprint):
                found["reused_from"] = str(other.resolve())
                atomic.write_json(path, found)
                logger.info("reuse %s from %s", name, other)
                return found
        if step is not None and self.store is not None and (restored := self._restore(step, fingerprint, records)):
            return restored
        if step is not None and (reused := self._reused_record(step, records)) is not None:
            source, found, key = reused
            found = {**found, "fingerprint": fingerprint,
                     "reused_record": {"from": str(source.path), "name": found["name"],
                                       "fingerprint": found["fingerprint"], "inputs": key}}
            atomic.write_json(path, found)
            logger.info("reuse %s from the record of %s in %s (the same settings on inputs of the same digests)",
                        name, found["reused_record"]["name"], source.path)
            return found
        return record

    def _reused_record(self, step: Step, records: dict) -> tuple | None:
        """For a step no other step needs: a reused results.json's record whose inputs match (``records``: its
        dependencies'), as (its results.json, the record, the inputs' key); None if none does."""
        if step.name in self._needed:
            return None
        key = inputs_key(step.kind, self.canonical(step.kind, step.settings),
                         {d: records[d]["digest"] for d in step.deps})
        for source in self.reused_records:
            if (found := source.find(key)) is not None:
                return source, found, key
        return None

    def _restore(self, step: Step, fingerprint: str, records: dict) -> dict | None:
        """The store's record of ``step`` if it has these inputs, its kept files unpacked and rebuilt into the
        step's work folder, and copied here; None if the store cannot stand in for the step."""
        if step.keep is None:  # made again in seconds, from what is restored: it runs
            return None
        stored = self.store.record(step.name)
        if stored is None or stored.get("fingerprint") != fingerprint or step.name in self._outputs_needed:
            return None
        if stored.get("kept"):
            self.store.restore(stored, self.work_dir / step.name, {n: r["result"] for n, r in records.items()},
                               step.rebuild)
        record = {**stored, "restored": {"from": str(self.store.root)}}
        outputs = record["result"].get("outputs", [])
        record["restored"]["outputs"] = all(Path(p).exists() for p in outputs) and (
            sha256_files(outputs) == record["digest"])
        atomic.write_json(self.records_dir / f"{step.name}.json", record)
        logger.info("restore %s from the store %s%s", step.name, self.store.root,
                    "" if record["restored"]["outputs"] else " (its record: no step to run reads its outputs)")
        return record

    def _keep(self, step: Step, record: dict) -> None:
        """The finished step's record and what it keeps, into the store, unless the store has them already."""
        if self.store is None or any(k in record for k in ("restored", "reused_record", "reused_from")):
            return
        stored = self.store.record(step.name)
        if (stored is not None and (stored["fingerprint"], stored["digest"]) == (record["fingerprint"], record["digest"])
                and ("kept" in stored) == (step.keep is not None)):
            return
        work = self.work_dir / step.name
        self.store.save(record, work, step.keep(work, record["result"]) if step.keep else None)

    def estimate(self, step: Step, records: dict) -> float | None:
        """The step's expected wall time in seconds on its dependencies' ``records`` (None: no record to go by)."""
        if self._estimates is None:
            own = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(self.records_dir.glob("*.json"))}
            self._estimates = Estimates([own] + ([self.store.records()] if self.store else [])
                                        + [source.steps for source in self.reused_records], self.threads)
        return self._estimates.seconds(step.name, step.kind, step.settings, records, self.work_dir / step.name)

    def _fits(self, step: Step, records: dict) -> bool:
        """Whether the step may start under ``hours``: its estimate fits in the time left (or there is no limit)."""
        if self.deadline is None:
            return True
        expected = self.estimate(step, records)
        if expected is not None and expected <= self.deadline - time.monotonic():
            self.held.pop(step.name, None)
            return True
        self.held[step.name] = expected
        return False

    def current(self, step: Step, records: dict) -> tuple[str, dict | None]:
        """The step's fingerprint on its dependencies' ``records``, and its record if that is up to date."""
        fingerprint = step_fingerprint(step, records)
        record = self._record(step.name, fingerprint, step, records)
        return fingerprint, record if self._up_to_date(step.name, record, fingerprint) else None

    def _up_to_date(self, name: str, record: dict | None, fingerprint: str) -> bool:
        """The record of step ``name`` is of these inputs, and its outputs are there with their digest (a record
        taken from a results.json has its outputs elsewhere, or nowhere: its inputs' digests matched instead, so it
        stands in only while no step of the plan reads them, e.g. the corpus reused by an ``--only prepare`` run)."""
        if record is None or record.get("fingerprint") != fingerprint:
            return False
        if "reused_record" in record:
            return name not in self._needed
        if record.get("restored", {}).get("outputs") is False:  # a checkpoint, never kept
            return record["name"] not in self._outputs_needed
        outputs = record["result"].get("outputs", [])
        return all(Path(p).exists() for p in outputs) and sha256_files(outputs) == record["digest"]

    def _execute(self, step: Step, fingerprint: str, records: dict) -> dict:
        with nullcontext(CPU) if step.in_driver else self.devices.lease() as device:
            return execute(self.root, step, fingerprint, {n: r["result"] for n, r in records.items()},
                           jobs=self.jobs, threads=self.threads, recipe=step_recipe(step, records), device=device)

    def run(self, steps: list[Step]) -> dict[str, dict]:
        """Run every step whose inputs changed, dependencies first; returns name -> record."""
        by_name = {s.name: s for s in steps}
        for s in steps:
            missing = [d for d in s.deps if d not in by_name]
            if missing:
                raise ValueError(f"step {s.name} depends on unknown step(s) {missing}")
            if s.in_driver and not all(by_name[d].in_driver for d in s.deps):
                raise ValueError(f"step {s.name} runs in the driver but depends on a job's step")
        self._needed = {d for s in steps for d in s.deps}
        records: dict[str, dict] = {}
        pending, running, failure = dict(by_name), {}, None
        limit = self.launcher.max_jobs if self.launcher else self.jobs

        def start(step: Step, *args):
            return (self._execute if step.in_driver or not self.launcher else self.launcher.start)(step, *args)

        with ThreadPoolExecutor(limit) as pool, self.launcher or nullcontext():
            while True:
                skipped = True
                while skipped and not failure:  # mark everything up to date first, however deep
                    skipped = False
                    for step in [s for s in pending.values() if all(d in records for d in s.deps)]:
                        record = self.current(step, records)[1]
                        if record is not None:
                            records[step.name] = record
                            self.skipped.append(step.name)
                            del pending[step.name]
                            skipped = True
                            self._keep(step, record)
                # then start what is ready in plan order, so a resumed run takes up the steps it had
                # begun (listed earlier) before fresh ones that only became ready sooner
                reopened = False
                for step in [s for s in pending.values() if all(d in records for d in s.deps)]:
                    if failure or len(running) >= limit:
                        break
                    if not all(d in records for d in step.deps):  # one of them reopened for a step before it
                        continue
                    lacking = [d for d in step.deps if records[d].get("restored", {}).get("outputs") is False]
                    if lacking:  # restored without the outputs this step reads: they are made again first
                        for name in lacking:
                            self._outputs_needed.add(name)
                            self.skipped.remove(name)
                            pending[name] = by_name[name]
                            del records[name]
                        reopened = True
                        continue
                    if not self._fits(step, records):
                        continue
                    logger.info("start %s", step.name)
                    running[pool.submit(start, step, step_fingerprint(step, records), dict(records))] = step
                    del pending[step.name]
                if not running and reopened:
                    continue
                if not running:
                    break
                done = set()
                while not done:  # bounded: a signal whose C handler ran in another thread is acted on only when
                    # this thread wakes (a driver's Ctrl-C, nat_kd.launch.signals)
                    done, _ = wait(running, timeout=1, return_when=FIRST_COMPLETED)
                for future in done:
                    step = running.pop(future)
                    try:
                        records[step.name] = future.result()
                    except StepError as err:
                        failure = failure or err  # let the running steps finish; start nothing new
                        continue
                    self.ran.append(step.name)
                    logger.info("done %s (%.0f s)", step.name, records[step.name]["wall_seconds"])
                    self._keep(step, records[step.name])
        if failure:
            raise failure
        if pending and not self.held:
            raise ValueError(f"steps {sorted(pending)} wait on each other (a dependency cycle)")
        return records

    def records(self, steps: list[Step]) -> dict[str, dict]:
        """The finished steps' records as they are, whether or not their inputs changed since."""
        return {s.name: r for s in steps if (r := self._record(s.name)) is not None}

    def _walk(self, steps: list[Step]) -> tuple[dict[str, dict], dict[str, str], dict[str, dict]]:
        """In plan order: the records of the steps whose inputs are as they were; every other step's state
        ("begun": its work folder holds a run with the same inputs, which the next run resumes; "stored": the
        store will restore it once its dependencies are made, e.g. in an empty folder; "reused": a reused
        results.json's record will stand in for it, likewise; or "to run"); and the
        store's records that the study expects to get back (the "stored" steps', and those of the steps that run
        again in seconds with the inputs the store recorded, such as the corpus)."""
        records, states, expected = {}, {}, {}
        self._needed = {d for s in steps for d in s.deps}
        for step in steps:
            ready = all(d in records for d in step.deps)
            fingerprint, record = self.current(step, records) if ready else (None, None)
            if record is not None:
                records[step.name] = record
                continue
            begun = ready and begun_with(self.work_dir / step.name, fingerprint, step_recipe(step, records))
            stored = None if begun or self.store is None else self.store.record(step.name)
            upstream = {d: records.get(d) or expected.get(d) for d in step.deps}
            known = not begun and None not in upstream.values()
            if known and stored is not None and step_fingerprint(step, upstream) == stored["fingerprint"]:
                expected[step.name] = stored
            reused = known and step.name not in expected and self._reused_record(step, upstream) is not None
            states[step.name] = ("begun" if begun else "stored" if step.name in expected and step.keep is not None
                                 else "reused" if reused else "to run")
        return records, states, expected

    def current_records(self, steps: list[Step]) -> dict[str, dict]:
        """The records of the steps whose inputs are as they were (a record of other inputs is left out)."""
        return self._walk(steps)[0]

    def states(self, steps: list[Step]) -> dict[str, str]:
        """Each step's state, in plan order: "done" (up to date), "begun" (its work folder holds a run with the
        same inputs, which the next run resumes), "stored" (the store will restore it), "reused" (a reused
        results.json's record will stand in for it) or "to run"; runs nothing."""
        records, others, expected = self._walk(steps)
        states = {s.name: others.get(s.name, "done") for s in steps}

        def without_outputs(name):  # restored (or to be) as a record alone: a teacher without its checkpoint
            if states[name] == "done":
                return records[name].get("restored", {}).get("outputs") is False
            return states[name] == "stored" and not self.store.restores_outputs(expected[name], self.work_dir / name)

        reopened = True
        while reopened:  # a step restored without the outputs that a step to run reads runs again (run)
            reopened = False
            for step in steps:
                for dep in step.deps if states[step.name] not in ("done", "stored") else ():
                    if without_outputs(dep):
                        states[dep], reopened = "to run", True
        return states

    def status(self, steps: list[Step]) -> list[str]:
        """One line a step, in plan order: its state (``states``) and its name."""
        return [f"{state:6}  {name}" for name, state in self.states(steps).items()]
