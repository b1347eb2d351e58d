"""Submitted jobs: found again by a later run, their state read from the scheduler, and how each one ended.

A job ends in one of three ways, and the drivers of both commands (the study's steps, the generator's shards)
treat them alike:

- done: it left its result;
- stopped from outside its work (RETRIED_STATES: preempted, its node failed, its time limit; or a job whose
  work failed after the scheduler signalled it): resubmitted, up to [launcher] max_retries, and the new job
  resumes what the stopped one saved;
- failed: its own error, which would fail the same way again, or cancelled from outside.

The scheduler's end state comes first: a preemption sends SIGTERM to every process of the job before it kills
them, so a child process (fairseq-train) dies of it and the job's work fails with an error of its own making.
The job notes the signal (``signals.noting_sigterm``) and says so in its error; the driver then waits, within
[launcher] unknown_seconds, for the scheduler to say how the job ended.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from nat_kd import atomic

from .settings import LauncherSettings

logger = logging.getLogger("nat_kd.launch")

# Slurm's states of a job that will still run: queued, running, or requeued by Slurm itself (submitit's requeue
# near the time limit, a preemption that requeues), which runs it again under the same id; UNKNOWN is
# submitit's until sacct knows a new job
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                 "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "READY", "UNKNOWN")
# the active states of a job that Slurm has put back in the queue after it ended: its earlier run's result is
# not this run's
REQUEUED_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD")
# the end states of a job stopped by a cause outside its work, so that running it again may succeed: preempted
# (where preemption cancels), its node failed or did not boot, its time limit (after submitit's requeues);
# submitit-local's job killed by a signal stands for these. Any other end is final: the job's own error, out of
# memory, cancelled, and also a COMPLETED job without a result.
RETRIED_STATES = ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "INTERRUPTED")
# a job that neither sacct nor squeue has known for [launcher] unknown_seconds: it is in no queue, so it ended,
# and not by its work's own doing (an id from another cluster or an earlier accounting, a lost job)
NOT_FOUND = "NOT_FOUND"
# what a job's error says when the scheduler signalled the job before its work failed (signals.JobSignalled)
SIGNALLED = "JobSignalled"
# what submitit's job saves as its error at a time limit once its requeues are spent (max_num_timeout, 3): the job
# ran out of time, as a TIMEOUT does, so it is retried as one
TIMED_OUT = "Job not requeued because: timed-out"


def classify(state: str) -> str:
    """A job's state as the drivers of both commands treat it: "active", "retried" or "final" (above); sacct's
    "CANCELLED by 1000" is CANCELLED."""
    state = state.split(" ")[0].upper()
    if state in ACTIVE_STATES:
        return "active"
    return "retried" if state in RETRIED_STATES or state == NOT_FOUND else "final"


@dataclass(frozen=True)
class Submitted:
    """A job this or an earlier run submitted, as written to its marker file: enough to find it again."""
    launcher: str
    job_id: str
    folder: str
    key: str  # what the job computes (a step's fingerprint): a marker for other work is stale

    def write(self, path: Path) -> None:
        atomic.write_json(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> Submitted | None:
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def job(self):
        """The submitit job, re-created from its id and folder (what a detached driver left running)."""
        import submitit

        if self.launcher == "slurm":
            return submitit.SlurmJob(folder=self.folder, job_id=self.job_id)
        return submitit.local.local.LocalJob(folder=self.folder, job_id=self.job_id)


class JobFailed(Exception):
    """A job that ended without its result. ``message``: one line, which job and why; ``state``: its end state;
    ``retry``: that state when running it again may succeed (stopped from outside its work), else None;
    ``requeued``: the scheduler put the same job back in its queue (wait on it again); ``log``: its stderr;
    ``counted``: its resubmission uses up a retry (not so for an id the scheduler never knew: nothing ran)."""

    def __init__(self, message: str, state: str, retry: str | None, log: Path | None, requeued: bool = False,
                 counted: bool = True):
        super().__init__(message)
        self.state, self.retry, self.log, self.requeued, self.counted = state, retry, log, requeued, counted


class Scheduler:
    """The scheduler as one driver sees its jobs, shared by the driver's threads.

    sacct is asked about all the jobs at once, every [launcher] poll_seconds at most (submitit's own watcher,
    left alone, asks at half the age of its newest job, up to every 10 minutes, so a job's end could be seen 10
    minutes late; and it keeps the last state it had through a failing sacct, so an outage would hide a job's
    end). A job sacct does not know, or every job while sacct fails (its accounting lags or is down, or the id is
    not this cluster's), is looked up in squeue; one that squeue says it does not know either, for [launcher]
    unknown_seconds, counts as ended (NOT_FOUND), with one warning. While squeue fails too nothing says the job
    has left the queue: it is waited on (one warning), never counted as ended, since a second job of its step
    would work in the same folder."""

    def __init__(self, launcher: str, settings: LauncherSettings):
        self.launcher, self.settings = launcher, settings
        self._lock = threading.Lock()
        self._asked = float("-inf")
        self._watched: set[str] = set()  # the jobs asked about: one sacct call asks about them all
        self._states: dict[str, str] = {}  # sacct's states of the jobs it knew at its last answer
        self._answered = True  # whether sacct answered its last call
        self._known: set[str] = set()  # the jobs sacct or squeue has known
        self._unknown_since: dict[str, float] = {}
        self._warned: set[str] = set()  # each warning once (per job where it names one)

    # ---------------------------------------------------------------- states

    def watch(self, jobs) -> None:
        """Ask about ``jobs`` too from now on (the next state() asks sacct at once, about all of them)."""
        with self._lock:
            self._watch(jobs)

    def _watch(self, jobs) -> None:
        new = {str(job.job_id) for job in jobs} - self._watched
        if new:
            self._watched |= new
            self._asked = float("-inf")

    def state(self, job) -> str:
        """The job's state now: Slurm's (PENDING, RUNNING, PREEMPTED, ... or NOT_FOUND), or for submitit-local
        RUNNING or ENDED."""
        if self.launcher == "debug":
            return "ENDED"
        if self.launcher == "submitit-local":
            if _local_running(job):
                return "RUNNING"
            # submitit's own state where the driver holds the process (INTERRUPTED: killed by a signal)
            return job.state if getattr(job, "_process", None) is not None else "ENDED"
        job_id = str(job.job_id)
        with self._lock:
            self._watch([job])
            if time.monotonic() - self._asked >= self.settings.poll_seconds:
                self._ask_sacct()
                self._asked = time.monotonic()
            state = self._states.get(job_id, "UNKNOWN")
            if not self._answered and classify(state) != "final":  # what sacct said last may be over by now
                state = "UNKNOWN"
            if state.split(" ")[0].upper() != "UNKNOWN":
                self._known.add(job_id)
                self._unknown_since.pop(job_id, None)
                return state
            return self._unknown(job_id)

    def knew(self, job) -> bool:
        """Whether sacct or squeue has ever known the job (an id it never knew ran nothing)."""
        with self._lock:
            return str(job.job_id) in self._known

    def _ask_sacct(self) -> None:
        """One sacct call about every job watched that has not ended for good; its answer in ``_states``, read by
        submitit's own reader (an array's tasks, "1_[2-5]" ranges of pending ones); sacct's error is warned about
        once, not printed at every call."""
        ids = sorted({i.split("_")[0] for i in self._watched if classify(self._states.get(i, "UNKNOWN")) != "final"})
        if not ids:
            return
        found = _command(["sacct", "-o", "JobID,State,NodeList", "--parsable2",
                          *(flag for i in ids for flag in ("-j", i))])
        self._answered = found is not None and found.returncode == 0
        if not self._answered:
            self._warn(f"sacct does not answer ({_said(found)}); the jobs are looked up in squeue until it does")
            return
        from submitit.slurm.slurm import SlurmInfoWatcher

        read = SlurmInfoWatcher().read_info(found.stdout)
        self._states.update({i: info["State"] for i, info in read.items() if info.get("State")})

    def _unknown(self, job_id: str) -> str:
        """The state of a job sacct does not know now: squeue's, else UNKNOWN, or NOT_FOUND once squeue has said
        for unknown_seconds that it does not know it either."""
        found = _command(["squeue", "--noheader", "--jobs", job_id, "--format", "%T"])
        states = found.stdout.split() if found is not None and found.returncode == 0 else []
        if states:
            self._known.add(job_id)
            self._unknown_since.pop(job_id, None)
            return states[0]
        if found is None or (found.returncode != 0 and "Invalid job id" not in found.stderr):
            # squeue fails too: nothing says the job has left the queue; the clock starts when squeue answers
            self._unknown_since.pop(job_id, None)
            self._warn(f"slurm job {job_id}: neither sacct nor squeue answers (squeue: {_said(found)}); waiting "
                       "for them")
            return "UNKNOWN"
        since = self._unknown_since.setdefault(job_id, time.monotonic())
        if time.monotonic() - since < self.settings.unknown_seconds:
            return "UNKNOWN"
        self._warn(f"slurm job {job_id}: neither sacct nor squeue has known it for {self.settings.unknown_seconds:g} "
                   "s; counted as ended")
        return NOT_FOUND

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s", message)

    def running(self, job, confirmed: bool = False, stop: threading.Event | None = None) -> bool:
        """Whether the job is queued or running (it has left no result, and the scheduler says it is active);
        ``confirmed``: only if the scheduler says so, so that an UNKNOWN job is asked about again every
        poll_seconds until it is known or counted as ended, or ``stop`` is set (then ``Stopped``)."""
        if self.launcher == "debug":
            return False
        if self.launcher == "slurm" and job.paths.result_pickle.exists():
            return False
        state = self.state(job)
        while confirmed and state == "UNKNOWN":
            if stop is not None and stop.wait(self.settings.poll_seconds):
                raise Stopped(f"job {job.job_id}")
            if stop is None:
                time.sleep(self.settings.poll_seconds)
            state = self.state(job)
        return classify(state) == "active"

    def wait(self, job, stop: threading.Event) -> None:
        """Block until ``job`` is no longer running, or ``stop`` is set: then raise ``Stopped``."""
        while self.running(job):
            if stop.wait(self.settings.poll_seconds):
                raise Stopped(f"job {job.job_id} left running")
        if stop.is_set():
            raise Stopped(f"job {job.job_id}")

    # ---------------------------------------------------------------- ends

    def outcome(self, job):
        """The result of a job that is no longer running; else JobFailed saying how it ended."""
        error = None
        if self.launcher == "debug" or job.paths.result_pickle.exists():
            try:
                return job.result()  # the debug launcher runs the job here, in this thread
            except Exception as err:  # noqa: BLE001 - the job's own error (its traceback), or the scheduler's end
                error = err
        signalled = error is not None and SIGNALLED in str(error)
        if self.launcher == "debug":
            raise JobFailed(f"debug job {job.job_id}: {_cause(error)}", "FAILED", None, None)
        where = f"{self.launcher} job {job.job_id}"
        if error is not None and TIMED_OUT in str(error):
            raise JobFailed(f"{where} reached its time limit after submitit's requeues ({_cause(error)})", "TIMEOUT",
                            "TIMEOUT", job.paths.stderr)
        state = self._end_state(job, settle=error is None or signalled)
        kind = classify(state)
        if signalled and kind == "active":  # Slurm requeued the preempted job itself: its next run is to come
            _set_aside(job.paths.result_pickle)
            raise JobFailed(f"{where} was requeued by the scheduler ({state})", state, state, job.paths.stderr,
                            requeued=True)
        if error is None and state == NOT_FOUND and not self.knew(job):
            raise JobFailed(f"{where} was never known to the scheduler (an id from elsewhere, or of a job that never "
                            "ran)", state, state, None, counted=False)
        if error is None or signalled:
            if kind == "retried" or (signalled and not state.upper().startswith("CANCELLED")):
                reason = f"signalled (SIGTERM), state {state}" if signalled else f"state {state}"
                raise JobFailed(f"{where} was stopped from outside its work ({reason})", state, state,
                                job.paths.stderr)
        cause = _cause(error) if error is not None else "it left no result" + _last_line(job.paths.stderr)
        shown = f", state {state}" if error is None or state.upper().startswith("CANCELLED") else ""
        raise JobFailed(f"{where}{shown}: {cause}", state, None, job.paths.stderr)

    def _end_state(self, job, settle: bool) -> str:
        """The scheduler's state of a job whose process has ended: asked at once, and with ``settle`` (the job
        left no result, or its work failed on a signal) asked again every poll_seconds, within unknown_seconds,
        while the scheduler still calls it RUNNING or COMPLETING (its accounting lags behind the process)."""
        with self._lock:
            self._asked = float("-inf")  # asked anew: the state in hand predates the job's end
        state = self.state(job)
        deadline = time.monotonic() + self.settings.unknown_seconds
        while (settle and self.launcher == "slurm" and classify(state) == "active"
               and state.split(" ")[0].upper() not in REQUEUED_STATES and time.monotonic() < deadline):
            time.sleep(self.settings.poll_seconds)
            state = self.state(job)
        return state

    def cancel(self, job) -> bool:
        """Cancel ``job`` (scancel, or submitit-local's SIGINT to the job's controller); whether it was cancelled."""
        try:
            if self.launcher == "submitit-local" and getattr(job, "_process", None) is None:
                if not _process_alive(job.job_id):  # a job found again from its marker: the pid is the controller's
                    return True
                os.kill(int(job.job_id), signal.SIGINT)
                return True
            job.cancel(check=True)
        except Exception as err:  # noqa: BLE001 - scancel refused, or the scheduler is unreachable
            logger.warning("%s job %s: could not cancel it: %s", self.launcher, job.job_id, " ".join(str(err).split()))
            return False
        return True


class Stopped(Exception):
    """The driver was told to stop (SIGINT/SIGTERM) while it waited on a job."""


def resubmits(failed: JobFailed, retries: int, settings: LauncherSettings, what: str, resumes: str) -> bool:
    """Whether a job that failed is submitted again, having been ``retries`` times already (the resubmissions
    that counted): only for a cause outside its work (its own error would fail the same way again), up to
    [launcher] max_retries, a job the scheduler never knew without using one up; says so."""
    if failed.retry is None:
        return False
    if not failed.counted:
        logger.warning("%s: %s; submitting it (no retry used)", what, failed)
        return True
    if retries >= settings.max_retries:
        return False
    logger.warning("%s: %s; resubmitting it (retry %d of %d), it resumes from %s", what, failed, retries + 1,
                   settings.max_retries, resumes)
    return True


def ended(job_id, state: str) -> dict:
    """A job's entry in the record of the work it did (a step's record, a distilled set's meta.json)."""
    return {"job_id": str(job_id), "state": state}


def _local_running(job) -> bool:
    """Whether a submitit-local job (maybe re-created from a marker, without its process handle) runs."""
    process = getattr(job, "_process", None)
    if process is not None:
        return process.poll() is None
    if job.paths.result_pickle.exists():
        return False
    return _process_alive(job.job_id)  # a LocalExecutor job's id is its controller's pid


def _process_alive(pid: str) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not reaped by its orphaned parent, does not)."""
    try:
        os.kill(int(pid), 0)
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def queued_by_name(name: str) -> list[str] | None:
    """The ids of the jobs named ``name`` that squeue lists (queued or running), in its order, an array's pending
    tasks ("7_[2-5]") one by one; None where squeue does not answer. A job's name is unique to its run and step
    (sbatch.job_name): a driver that lost a job's id finds the job again by it."""
    from submitit.slurm.slurm import read_job_id

    found = _command(["squeue", "--noheader", "--name", name, "--format", "%i"])
    if found is None or found.returncode != 0:
        return None
    ids = []
    for listed in found.stdout.split():
        for main, *tasks in read_job_id(listed):
            ids += [f"{main}_{k}" for k in range(int(tasks[0]), int(tasks[-1]) + 1)] if tasks else [main]
    return ids


def _command(command: list[str]) -> subprocess.CompletedProcess | None:
    """A Slurm command run, its output captured (what it says is for the driver's one warning); None where it
    cannot be run or does not end within a minute."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _said(found: subprocess.CompletedProcess | None) -> str:
    """What a Slurm command that failed said, in one line."""
    if found is None:
        return "it could not be run, or did not end within a minute"
    return " ".join(found.stderr.split()) or f"exit status {found.returncode}"


def _set_aside(result: Path) -> None:
    """A requeued job's earlier result moved out of the way of its next run's (kept beside it)."""
    if result.exists():
        result.rename(result.with_name(f"{result.stem}.earlier-{int(time.time())}{result.suffix}"))


def _cause(error: BaseException) -> str:
    """A job's own error in one line: the last exception line of its traceback, else its first line."""
    lines = [line.strip() for line in str(error).splitlines()]
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Interrupt|Exit|Signalled)\b", line)]
    return raised[-1] if raised else next((line for line in lines if line), type(error).__name__)


def _last_line(path: Path | None) -> str:
    """': ' and the last line of a job's stderr (what the scheduler or the interpreter said last), if any."""
    if path is None or not Path(path).is_file():
        return ""
    lines = [line for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return f" ({lines[-1].strip()})" if lines else ""
