"""The study's steps as cluster jobs (``--launcher slurm``): what each step asks for, and the launcher the
Runner hands its ready steps to.

Each step becomes one submitit job running ``steps.execute``: the same function the local runner calls,
which writes the step record itself. So ``steps/NAME.json`` stays the one record of a finished step
whichever way it ran, and a job left running by a stopped driver (``--detach``) is found again by the next
run: through the job's marker ``jobs/NAME/submitted.json`` while it runs, through its record once it is done.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from pathlib import Path

import submitit

from nat_kd.launch import (ClusterConfig, Resources, Submitted, job_failure, make_executor, sbatch_lines,
                           sbatch_script, still_running, tail, wait_for)

from .steps import Step, StepError, execute

logger = logging.getLogger("nat_kd.study")

# What each kind of step asks for unless [resources.KIND] or [resources."STEP NAME"] says otherwise. Sized
# for the paper profile on one GPU per model job (docs/study.md, "On a cluster": where the hours come from).
STEP_RESOURCES = {
    "prepare": Resources(gpus=0, cpus=4, mem_gb=16, hours=4),  # sentencepiece and binarizing, CPU only
    "train": Resources(gpus=1, cpus=8, mem_gb=32, hours=72),  # fairseq-train, then decoding valid and test
    "distil": Resources(gpus=1, cpus=8, mem_gb=32, hours=24),  # one teacher decoding the training set
    "analysis": Resources(gpus=0, cpus=2, mem_gb=32, hours=24),  # fast_align-style tables over every set
    "modes": Resources(gpus=0, cpus=2, mem_gb=16, hours=2),  # unigram language models and a few test sets
}


def step_resources(cluster: ClusterConfig, step: Step) -> Resources:
    return cluster.resources_for(STEP_RESOURCES, step.kind, step.name)


def check_resource_keys(cluster: ClusterConfig, steps: list[Step], where: str) -> None:
    """Every [resources.X] names a step kind or a step of the plan (a typo would silently keep a default)."""
    known = set(STEP_RESOURCES) | {s.kind for s in steps} | {s.name for s in steps}
    unknown = sorted(set(cluster.resources) - known)
    if unknown:
        from .config import ConfigError

        raise ConfigError(f"{where}: [resources.{unknown[0]}] is neither a step kind ({', '.join(STEP_RESOURCES)}) "
                          "nor a step of this study (python -m nat_kd.study CONFIG --list names them)")


class StepJob(submitit.helpers.Checkpointable):
    """A job's body: the step, run where the scheduler put it, its record saying which job it was.

    Checkpointable: when Slurm's time limit nears (its USR2 signal), submitit requeues the job with the
    same call, up to 3 times; the step then runs again in its kept work folder, so a fairseq-train continues
    from its last checkpoint (a 300k-update training can outlast a partition's time limit)."""

    def __call__(self, root: str, step: Step, fingerprint: str, results: dict, resources: Resources, launcher: str,
                 max_jobs: int) -> dict:
        job_id = submitit.JobEnvironment().job_id
        return execute(Path(root), step, fingerprint, results, jobs=max_jobs, threads=resources.cpus,
                       gpus=resources.gpus,
                       extra={"launcher": {"launcher": launcher, "job_id": job_id, "resources": asdict(resources)}})


class JobLauncher:
    """Submits steps as jobs and waits on them, one Runner thread a job; a context manager whose exit by an
    exception (Ctrl-C, SIGTERM) cancels the jobs it submitted, or with ``detach`` leaves them running."""

    def __init__(self, root: Path, launcher: str, cluster: ClusterConfig, detach: bool = False):
        self.root, self.launcher, self.cluster, self.detach = Path(root), launcher, cluster, detach
        self.settings = cluster.launcher
        # submitit's debug jobs run in the driver and swap its os.environ while they run: one at a time
        self.max_jobs = 1 if launcher == "debug" else self.settings.max_jobs
        self.stop = threading.Event()
        self._jobs, self._lock = {}, threading.Lock()

    def folder(self, step: Step) -> Path:
        """The step's job files (submitit's pickles and streams) and its marker submitted.json."""
        return self.root / "jobs" / step.name

    def start(self, step: Step, fingerprint: str, records: dict) -> dict:
        """Submit ``step`` (or find the job an earlier run left running on it), wait for it; returns its
        record or raises StepError with its log's tail and its job id."""
        marker = self.folder(step) / "submitted.json"
        previous = Submitted.read(marker)
        job = None
        if previous is not None and previous.key == fingerprint and previous.launcher == self.launcher:
            found = previous.job()
            if still_running(found, self.launcher):
                logger.info("%s: %s job %s from an earlier run is still running; waiting for it", step.name,
                            self.launcher, found.job_id)
                job = found
        if job is None:
            resources = step_resources(self.cluster, step)
            executor = make_executor(self.launcher, self.folder(step), resources, self.settings, f"nat_kd.{step.name}")
            results = {n: r["result"] for n, r in records.items()}
            job = executor.submit(StepJob(), str(self.root), step, fingerprint, results, resources,
                                  self.launcher, self.max_jobs)
            Submitted(self.launcher, str(job.job_id), str(self.folder(step)), fingerprint).write(marker)
            logger.info("%s: submitted %s job %s (%s)", step.name, self.launcher, job.job_id, resources.describe())
        with self._lock:
            self._jobs[step.name] = job
        log = self.root / "logs" / f"{step.name}.log"
        try:
            wait_for(job, self.launcher, self.settings.poll_seconds, self.stop)
            try:
                record = job.result()  # the debug launcher runs the job here, in this thread
            except Exception as err:  # noqa: BLE001 - the job's own error, or the scheduler's (killed, timed out)
                raise StepError(f"step {step.name} failed in {job_failure(job, self.launcher, err)}\n  log: {log}"
                                + tail(log)) from None
            marker.unlink(missing_ok=True)
            return record
        finally:
            with self._lock:
                self._jobs.pop(step.name, None)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            return
        self.stop.set()
        with self._lock:
            jobs = dict(self._jobs)
        for name, job in jobs.items():
            if self.detach:
                logger.info("%s: %s job %s left running (--detach); rerun the same command to collect it",
                            name, self.launcher, job.job_id)
            else:
                logger.info("%s: cancelling %s job %s", name, self.launcher, job.job_id)
                (self.root / "jobs" / name / "submitted.json").unlink(missing_ok=True)
                try:
                    job.cancel(check=False)
                except Exception as err:  # noqa: BLE001 - the job may have ended meanwhile
                    logger.warning("%s: could not cancel job %s: %s", name, job.job_id, err)


def submitted_note(root: Path, step: Step) -> str:
    """For --list: the job a run submitted for a step that is not done (running, or left by a stopped
    driver); empty if none."""
    job = Submitted.read(Path(root) / "jobs" / step.name / "submitted.json")
    return f"  ({job.launcher} job {job.job_id} submitted)" if job else ""


def dry_run(steps: list[Step], runner, cluster: ClusterConfig) -> list[str]:
    """Every step that would be submitted (not done yet), with its resources and sbatch options."""
    lines = []
    for step, status in zip(steps, runner.status(steps)):
        if status.startswith("done"):
            continue
        resources = step_resources(cluster, step)
        after = f" after {', '.join(step.deps)}" if step.deps else ""
        lines.append(f"{step.name}  [{step.kind}: {resources.describe()}]{after}")
        script = sbatch_script(resources, cluster.launcher, f"nat_kd.{step.name}",
                               runner.root / "jobs" / step.name)
        lines += [f"    {line}" for line in sbatch_lines(script) if not line.startswith(("#SBATCH --output",
                                                                                           "#SBATCH --error"))]
    return lines
