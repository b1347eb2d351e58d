"""The study's steps as cluster jobs (``--launcher slurm``): what each step asks for, and the launcher the
Runner hands its ready steps to.

Each step becomes one submitit job running ``steps.execute``: the same function the local runner calls,
which writes the step record itself. So ``steps/NAME.json`` stays the one record of a finished step
whichever way it ran, and a job left running by a stopped driver is found again by the next run: through the
job's marker ``jobs/NAME/submitted.json`` while it runs, through its record once it is done.

With ``--detach`` on Slurm the driver does not wait: it submits every step that is not done at once, each
job held in Slurm's queue until its dependencies' jobs have succeeded (``--dependency=afterok``), and exits;
each job then reads its dependencies' records itself (``StepJob`` without a fingerprint).
"""
from __future__ import annotations

import logging
import sys
import threading
from dataclasses import asdict
from pathlib import Path

import submitit

from nat_kd.hashing import sha256_json
from nat_kd.launch.jobs import JobFailed, Scheduler, Stopped, Submitted, ended, queued_by_name, resubmits
from nat_kd.launch.sbatch import job_name, make_executor, sbatch_lines, sbatch_script, submission
from nat_kd.launch.settings import (JOB_RESOURCES, KINDS, STUDY, ClusterConfig, LaunchError, LauncherSettings,
                                    Resources, check_job, check_tables)
from nat_kd.launch.signals import critical, noting_sigterm, sigterm_as_interrupt

from .runner import Runner, Step, StepError, execute, step_recipe

logger = logging.getLogger("nat_kd.study")

# what each kind of step asks for unless [resources.KIND] or [resources."STEP NAME"] says otherwise
STEP_RESOURCES = {kind: JOB_RESOURCES[kind] for kind in KINDS[STUDY]}


def step_resources(cluster: ClusterConfig, step: Step) -> Resources:
    return cluster.resources_for(STUDY, step.kind, step.name)


def check_resources(cluster: ClusterConfig, steps: list[Step], where: str) -> None:
    """Every [resources.X] names a step kind or a step of the plan (a typo would silently keep a default), or is
    the generator's (noted), and what each step asks for fits together; before anything is submitted."""
    check_tables(cluster, STUDY, where, {s.name: s.kind for s in steps})
    for step in steps:
        check_job(step_resources(cluster, step), f"{where}: step {step.name} ([resources.{step.kind}])")


def plan_key(step: Step) -> str:
    """What a job submitted by --detach computes, known before its dependencies have run: the step's kind,
    settings and dependencies (its fingerprint also hashes their outputs)."""
    return sha256_json({"kind": step.kind, "settings": step.settings, "deps": step.deps})


class StepJob(submitit.helpers.Checkpointable):
    """A job's body: the step, run where the scheduler put it, its record saying which job it was.

    Checkpointable: when Slurm's time limit nears (its USR2 signal), submitit requeues the job with the
    same call, up to 3 times; the step then runs again in its kept work folder, so a fairseq-train continues
    from its last checkpoint (a 300k-update training can outlast a partition's time limit)."""

    def __call__(self, root: str, step: Step, fingerprint: str | None, results: dict | None, resources: Resources,
                 launcher: str, max_jobs: int, deps: list[Step] = (), recipe: dict | None = None,
                 earlier: tuple[dict, ...] = ()) -> dict:
        """``earlier``: the step's jobs before this one, each with its end state (``jobs.ended``), for the record."""
        job_id = submitit.JobEnvironment().job_id
        if fingerprint is None:  # submitted by --detach before its dependencies ran: their records say now
            runner = Runner(Path(root))
            records = runner.records(deps)
            missing = [d.name for d in deps if d.name not in records]
            if missing:
                raise StepError(f"step {step.name}: its dependencies {', '.join(missing)} have no record in "
                                f"{root}/steps: rerun the study's command to submit them again")
            fingerprint, done = runner.current(step, records)
            if done is not None:  # done meanwhile (another run of the study)
                return done
            recipe = step_recipe(step, records)
            results = {name: record["result"] for name, record in records.items()}
        launched = {"launcher": launcher, "job_id": job_id, "resources": asdict(resources),
                    "jobs": [*earlier, ended(job_id, "COMPLETED")]}
        with noting_sigterm(f"step {step.name}"):
            return execute(Path(root), step, fingerprint, results, jobs=max_jobs, threads=resources.cpus,
                           job=resources, extra={"launcher": launched}, recipe=recipe)


class JobLauncher:
    """Submits steps as jobs and waits on them, one Runner thread a job; a context manager whose exit by an
    exception (Ctrl-C, SIGTERM) cancels the jobs it submitted, or with ``detach`` leaves them running, and
    ``stopped`` then says which."""

    def __init__(self, root: Path, launcher: str, cluster: ClusterConfig, detach: bool = False):
        self.root, self.launcher, self.cluster, self.detach = Path(root), launcher, cluster, detach
        self.settings = cluster.launcher
        self.scheduler = Scheduler(launcher, self.settings)
        # submitit's debug jobs run in the driver and swap its os.environ while they run: one at a time
        self.max_jobs = 1 if launcher == "debug" else self.settings.max_jobs
        self.stop = threading.Event()
        # step -> its job while it is queued or running; stop and the jobs change together, under the lock, so
        # that a job is either in the list the exit cancels or cancelled by the thread that submitted it
        self._jobs, self._lock = {}, threading.Lock()
        self.stopped: dict[str, list[str]] = {"cancelled": [], "left running": []}  # "STEP (JOB ID)" each

    def folder(self, step: Step) -> Path:
        """The step's job files (submitit's pickles and streams) and its marker submitted.json."""
        return self.root / "jobs" / step.name

    def start(self, step: Step, fingerprint: str, records: dict) -> dict:
        """Submit ``step`` (or find the job an earlier run left running on it), wait for it, and submit it again
        should a cause outside its work end it (jobs.RETRIED_STATES, up to [launcher] max_retries); returns its
        record, whose ``launcher.jobs`` lists every job of the step with its end state, or raises StepError: one
        line saying which job failed and why, and the path of the step's log."""
        job = self._queued(step, fingerprint)
        if job is not None:
            logger.info("%s: %s job %s from an earlier run is still running; waiting for it", step.name,
                        self.launcher, job.job_id)
            self._track(step, job)
        log, earlier, retries = self.root / "logs" / f"{step.name}.log", [], 0
        while True:
            if job is None:
                job = self._submit(step, fingerprint, records, tuple(earlier))
            try:
                self.scheduler.wait(job, self.stop)
                record = self.scheduler.outcome(job)
            except Stopped:
                raise
            except JobFailed as failed:
                if failed.requeued:  # the same job, back in the scheduler's queue
                    logger.warning("step %s: %s", step.name, failed)
                    continue
                self._untrack(step)
                earlier.append(ended(job.job_id, failed.state))
                if resubmits(failed, retries, self.settings, f"step {step.name}", "its work folder"):
                    retries += failed.counted
                    job = None
                    continue
                shown = log if log.is_file() else failed.log
                history = (f" (after {len(earlier) - 1} resubmission(s): "
                           + ", ".join(f"job {e['job_id']} {e['state']}" for e in earlier[:-1]) + ")"
                           if len(earlier) > 1 else "")
                raise StepError(f"step {step.name} failed in {failed}{history}\n  log: {shown}") from None
            self._untrack(step)
            (self.folder(step) / "submitted.json").unlink(missing_ok=True)
            return record

    def _track(self, step: Step, job) -> None:
        """``job`` is the step's: cancelled with the others should the driver stop, or at once if it has."""
        with self._lock:
            if not self.stop.is_set():
                self._jobs[step.name] = job
                return
        self._stop_one(step.name, job)
        raise Stopped(f"job {job.job_id}")

    def _untrack(self, step: Step) -> None:
        with self._lock:
            self._jobs.pop(step.name, None)

    def _submit(self, step: Step, fingerprint: str, records: dict, earlier: tuple[dict, ...] = ()):
        """The step's job, submitted, its marker written, and tracked; a StepError if the scheduler refuses it
        (this step fails; the jobs running go on: Runner.run collects them)."""
        resources = step_resources(self.cluster, step)
        executor = make_executor(self.launcher, self.folder(step), resources, self.settings,
                                 job_name(step.name, self.root))
        results = {n: r["result"] for n, r in records.items()}
        try:
            with submission(self.launcher):
                job = executor.submit(StepJob(), str(self.root), step, fingerprint, results, resources,
                                      self.launcher, self.max_jobs, recipe=step_recipe(step, records),
                                      earlier=earlier)
        except LaunchError as err:
            raise StepError(f"step {step.name} failed: {err}{self._cancel_unreported(step)}") from None
        Submitted(self.launcher, str(job.job_id), str(self.folder(step)), fingerprint).write(
            self.folder(step) / "submitted.json")
        logger.info("%s: submitted %s job %s (%s)", step.name, self.launcher, job.job_id, resources.describe())
        self._track(step, job)
        return job

    def _queued(self, step: Step, fingerprint: str | None = None):
        """The job an earlier run submitted for ``step`` (on these inputs, or by --detach) if it is still queued
        or running, else None; a StepError if one submitted with other settings is, since a second job would
        work in the same folder (wiping it, or continuing the same training beside it). Without a marker, a
        job of the step's name in Slurm's queue is the step's, whose id an earlier run lost: it is waited on
        instead of submitting another."""
        previous = Submitted.read(self.folder(step) / "submitted.json")
        if previous is None or previous.launcher != self.launcher:
            return self._found_by_name(step, fingerprint)
        job = previous.job()
        if previous.key in (fingerprint, plan_key(step)):
            return job if self.scheduler.running(job) else None
        # refused only once the scheduler says the job is there: an id it never knows is a stale marker
        if self.scheduler.running(job, confirmed=True, stop=self.stop):
            raise StepError(f"step {step.name}: {self.launcher} job {job.job_id}, submitted by an earlier run with "
                            "other settings, is still queued or running in its folder; wait for it to end or "
                            f"cancel it{' (scancel ' + str(job.job_id) + ')' if self.launcher == 'slurm' else ''}, "
                            "then run again")
        return None

    def _cancel_unreported(self, step: Step) -> str:
        """After a failed sbatch: a job of the step's name in the queue that no marker names was queued by it all
        the same (its reply lost): cancelled, since submitit gives a job its work only once sbatch has printed
        the id; returns what was done, for the message."""
        if self.launcher != "slurm":
            return ""
        marked = Submitted.read(self.folder(step) / "submitted.json")  # the step's job before it, if any
        unreported = [job_id for job_id in queued_by_name(job_name(step.name, self.root)) or []
                      if marked is None or job_id != marked.job_id]
        for job_id in unreported:
            self.scheduler.cancel(submitit.SlurmJob(folder=self.folder(step), job_id=job_id))
        return (f" (sbatch queued slurm job(s) {', '.join(unreported)} without saying so: cancelled, as they would "
                "never get their work)" if unreported else "")

    def _found_by_name(self, step: Step, fingerprint: str | None):
        """A Slurm job of the step's name (unique to this run and step) in the queue, with no marker: its
        marker written (for these inputs), and the job returned; else None."""
        if self.launcher != "slurm":
            return None
        name = job_name(step.name, self.root)
        ids = queued_by_name(name) or []
        if not ids:
            return None
        job = submitit.SlurmJob(folder=self.folder(step), job_id=ids[0])
        logger.warning("%s: slurm job %s, named %s, is in the queue with no marker (an earlier run lost its id): "
                       "taken as the step's, instead of submitting another", step.name, job.job_id, name)
        Submitted(self.launcher, str(job.job_id), str(self.folder(step)), fingerprint or plan_key(step)).write(
            self.folder(step) / "submitted.json")
        return job

    def submit_plan(self, runner: Runner, steps: list[Step]) -> tuple[list[str], list[str]]:
        """--detach: every step that is not done as a job at once, each held in Slurm's queue until the jobs of
        its dependencies have succeeded (afterok; a job whose dependency failed is removed from the queue), so
        the cluster runs the plan without the driver. A step already in the queue keeps its job, unless a step it
        needs is submitted again now: then its job waits on a job that failed, so it is cancelled and submitted
        again after the new one (not every cluster removes such a job itself); if that step cannot be submitted
        now, the job is cancelled and the step not submitted. Returns a line a job and the
        failures (a refused submission, and the steps that would have waited on it). The steps that run in the
        driver run first, here: the jobs wait for nothing but other jobs."""
        runner.run([s for s in steps if s.in_driver])
        states = runner.states(steps)
        by_name, ids, lines, failures, fresh = {s.name: s for s in steps}, {}, [], [], set()
        for step in steps:
            if states[step.name] == "done":
                continue
            unsubmitted = [d for d in step.deps if states[d] != "done" and d not in ids]
            if unsubmitted:
                needs = ", ".join(unsubmitted)
                failures.append(f"step {step.name} not submitted: it needs {needs}" + self._cancel_waiting(step, needs))
                continue
            after = tuple(ids[d] for d in step.deps if d in ids)
            try:
                job = self._queued(step)
            except StepError as err:
                failures.append(str(err))
                continue
            cancelled = ""
            if job is not None:
                failed = [d for d in step.deps if d in fresh]
                if not failed:
                    ids[step.name] = str(job.job_id)
                    lines.append(f"{step.name}: {self.launcher} job {job.job_id} already in the queue")
                    self.stopped["left running"].append(f"{step.name} ({self.launcher} job {job.job_id})")
                    continue
                job.cancel(check=False)
                cancelled = (f"cancelled {self.launcher} job {job.job_id}, which waited on a failed job of "
                             f"{', '.join(failed)}; ")
            resources = step_resources(self.cluster, step)
            executor = make_executor(self.launcher, self.folder(step), resources, self.settings,
                                     job_name(step.name, self.root), after)
            try:
                # a signal meanwhile is raised once the job's marker is written: a rerun then finds the job
                with critical(), submission(self.launcher):
                    job = executor.submit(StepJob(), str(self.root), step, None, None, resources, self.launcher,
                                          self.max_jobs, [by_name[d] for d in step.deps])
                    Submitted(self.launcher, str(job.job_id), str(self.folder(step)), plan_key(step)).write(
                        self.folder(step) / "submitted.json")
                    self.stopped["left running"].append(f"{step.name} ({self.launcher} job {job.job_id})")
            except LaunchError as err:
                failures.append(f"step {step.name} failed: {cancelled}{err}")
                continue
            ids[step.name] = str(job.job_id)
            fresh.add(step.name)
            lines.append(f"{step.name}: {cancelled}submitted {self.launcher} job {job.job_id}"
                         + (f" after job(s) {', '.join(after)}" if after else "") + f" ({resources.describe()})")
        return lines, failures

    def _cancel_waiting(self, step: Step, needs: str) -> str:
        """Cancel the job an earlier run queued for ``step``, which waits on a job of ``needs`` that is no longer
        queued and could not be submitted again, so it can never start; returns what was done, for the line."""
        try:
            job = self._queued(step)
        except StepError:  # submitted with other settings: left to the user, as the run that meets it says
            return ""
        if job is None:
            return ""
        job.cancel(check=False)
        return f"; cancelled {self.launcher} job {job.job_id}, which waited on a job of {needs} that will not run"

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            return
        with self._lock:  # from here on, a job submitted meanwhile is stopped by its own thread (_track)
            self.stop.set()
            jobs = dict(self._jobs)
            self._jobs.clear()
        for name, job in jobs.items():
            self._stop_one(name, job)

    def _stop_one(self, name: str, job) -> None:
        """Cancel a step's job (or with ``detach`` leave it running), noted in ``stopped``; its marker goes only
        with the job, so that a rerun waits on a job that could not be cancelled instead of training beside it."""
        label = f"{name} ({self.launcher} job {job.job_id})"
        if self.detach:
            logger.info("%s: %s job %s left running (--detach); rerun the same command to collect it",
                        name, self.launcher, job.job_id)
            self.stopped["left running"].append(label)
            return
        logger.info("%s: cancelling %s job %s", name, self.launcher, job.job_id)
        if self.scheduler.cancel(job):
            (self.root / "jobs" / name / "submitted.json").unlink(missing_ok=True)
            self.stopped["cancelled"].append(label)
        else:
            self.stopped["left running"].append(label)

    def stop_report(self) -> str:
        """What a stopped driver did with its jobs, in one line."""
        parts = [f"{what}: {', '.join(jobs)}" for what, jobs in self.stopped.items() if jobs]
        if self.stopped["left running"] and not self.detach:
            parts.append("the next run waits for them")
        return "; ".join(parts) if parts else "no job was running"


def run_stoppable(runner: Runner, steps: list[Step], launcher: JobLauncher | None) -> dict:
    """``runner.run(steps)``; with a launcher, Ctrl-C or SIGTERM stops it as Ctrl-C does (``sigterm_as_interrupt``),
    its jobs cancelled or left running and a line saying which."""
    if launcher is None:
        return runner.run(steps)
    with sigterm_as_interrupt():  # the line too: a signal after the handlers are restored would end the driver first
        try:
            return runner.run(steps)
        except KeyboardInterrupt:
            print(f"jobs: {launcher.stop_report()}", file=sys.stderr)
            raise


def submit_detached(launcher: JobLauncher, runner: Runner, steps: list[Step], then: str) -> int:
    """--launcher slurm --detach: the plan's jobs chained in Slurm's queue (JobLauncher.submit_plan), a line
    each, and ``then`` (what to run next); 2 where a step could not be submitted. Stopped by Ctrl-C or SIGTERM,
    it ends once the job being submitted has its marker, the jobs queued so far named in one line: they stay in
    the queue, and a rerun finds them."""
    with sigterm_as_interrupt():
        try:
            lines, failures = launcher.submit_plan(runner, steps)
        except KeyboardInterrupt:
            print(f"jobs: {launcher.stop_report()}", file=sys.stderr)
            raise
    for line in lines + failures:
        print(line)
    print(f"{len(lines)} job(s) in the queue; {then}")
    if failures:
        print(f"error: {len(failures)} step(s) not submitted: {failures[0]}", file=sys.stderr)
        return 2
    return 0


def job_notes(root: Path, steps: list[Step]) -> dict[str, str]:
    """For --list: the job a run submitted for each of ``steps`` (not done: queued, running, or ended without
    its record), with its state read back from Slurm (sacct) now; a step without one has none."""
    submitted = {s.name: job for s in steps if (job := Submitted.read(Path(root) / "jobs" / s.name / "submitted.json"))}
    jobs = {name: job.job() for name, job in submitted.items()}
    schedulers = {launcher: Scheduler(launcher, LauncherSettings()) for launcher in {j.launcher for j in submitted.values()}}
    for name, job in jobs.items():  # watched first: one sacct call asks about them all
        schedulers[submitted[name].launcher].watch([job])
    return {name: f"  ({job.launcher} job {job.job_id} {schedulers[job.launcher].state(jobs[name])})"
            for name, job in submitted.items()}


def dry_run(steps: list[Step], runner, cluster: ClusterConfig, detach: bool = False) -> list[str]:
    """Every step that would be submitted (not done yet), with its resources, sbatch options and setup lines;
    with ``detach``, each job's dependency on the jobs of its dependencies (their step names in place of the
    job ids Slurm gives them)."""
    lines, by_name = [], {s.name: s for s in steps}
    pending = [step.name for step, status in zip(steps, runner.status(steps)) if not status.startswith("done")]
    for step in [s for s in steps if s.name in pending]:
        after = f" after {', '.join(step.deps)}" if step.deps else ""
        if step.in_driver:
            lines.append(f"{step.name}  [{step.kind}: in the driver, no job]{after}")
            continue
        resources = step_resources(cluster, step)
        lines.append(f"{step.name}  [{step.kind}: {resources.describe()}]{after}")
        waits = tuple(d for d in step.deps if d in pending and not by_name[d].in_driver) if detach else ()
        script = sbatch_script(resources, cluster.launcher, job_name(step.name, runner.root),
                               runner.root / "jobs" / step.name, after=waits)
        lines += [f"    {line}" for line in sbatch_lines(script)]
    return lines
