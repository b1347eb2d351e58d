"""Signals, in a driver and in a job.

A driver (the study's, the generator's) turns SIGTERM into Ctrl-C, so that it cancels its jobs (or leaves them
running with --detach) however it is stopped; a second signal while it does so is noted and waited out, never
allowed to cut the cancelling short (a job left running unrecorded would train beside the rerun). Python runs
a signal's handler in the main thread, but the kernel may hand the signal to any thread (one whose handler has
then run, the main thread knows of only when it wakes): so the driver's main thread never waits without a
bound. sbatch runs with the signals held (``signals_held``), so that one sent to the driver's process group
cannot end it between queuing a job and printing its id.

A job notes the SIGTERM that a scheduler sends every process of a job it preempts, cancels, or stops at its
node's failure or its time limit, a grace time before SIGKILL: submitit's own handler ignores it in the job's
main process, but a child process (fairseq-train, a decoding worker) dies of it, and the work then fails with
an error of its own. Raised as ``JobSignalled``, that error tells the driver to ask the scheduler how the job
ended (nat_kd.launch.jobs) instead of taking it for the work's own failure.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager

from nat_kd.errors import NatKdError


class JobSignalled(NatKdError):
    """A job's work failed after the scheduler signalled the job: the failure is the signal's, not the work's."""


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM (scancel of the driver, a kill) raises KeyboardInterrupt like Ctrl-C while the block runs, so
    the driver cancels or leaves its jobs as it does on SIGINT instead of dying on the spot. Only the first
    signal raises: any that come after it, however soon, are noted in the log and ignored until the block has
    ended, so that the cancelling it set off runs to its end.

    SIGINT raises it too, also in a driver started with SIGINT ignored (``nohup ... &`` in a script):
    otherwise the processes started in the block would inherit the ignored signal, and submitit-local cancels a
    job by SIGINT to its controller process, which would then run on beside the rerun that does its step again.
    The driver itself then stops on SIGINT too, which is safe: every such command resumes where it stopped."""
    received: list[int] = []

    def interrupt(signum, frame):
        received.append(signum)
        if len(received) > 1:
            logging.getLogger("nat_kd.launch").warning("signal %d again: still stopping the jobs; wait for it", signum)
            return
        if _critical.depth:  # raised as the critical section ends
            _critical.pending = signum
            return
        raise KeyboardInterrupt(f"signal {signum}")

    previous_term = signal.signal(signal.SIGTERM, interrupt)
    previous_int = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


class _Critical:
    depth, pending = 0, None


_critical = _Critical()


@contextmanager
def critical():
    """In a driver's main thread under ``sigterm_as_interrupt``: a stretch that a signal must not cut in two, such
    as submitting jobs and noting their ids (cut between the two, a job would run on that nobody cancels). A
    signal that comes meanwhile raises KeyboardInterrupt as the stretch ends."""
    _critical.depth += 1
    try:
        yield
    finally:
        _critical.depth -= 1
        if not _critical.depth and _critical.pending is not None:
            signum, _critical.pending = _critical.pending, None
            raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def signals_held():
    """SIGINT and SIGTERM held back from the calling thread while the block runs, and so from the processes it
    starts meanwhile (a signal mask is inherited and kept across exec): a signal sent to the driver's process
    group then reaches the driver, which stops as it does on any, and not the sbatch it is waiting for. A
    signal sent to the driver itself goes to a thread that takes it, or waits until the block ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextmanager
def noting_sigterm(what: str):
    """In a job's process, around its work (``what``: the step or the shard, for the message): a SIGTERM is
    noted before it reaches the handler that was there (submitit's, which ignores it), and an error the work
    raises after it is re-raised as JobSignalled. A job run in a thread (submitit's debug executor, in the
    driver) has no signals of its own: nothing is done there."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[str] = []
    previous = signal.getsignal(signal.SIGTERM)

    def note(signum, frame):
        received.append(time.strftime("%H:%M:%S"))
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, note)
    try:
        yield
    except Exception as err:
        if received:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise JobSignalled(f"{what}: the job was sent SIGTERM at {received[0]}, and then its work failed: "
                               f"{type(err).__name__}: {first}") from err
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def submitit_warnings_once() -> None:
    """In a driver: submitit's log lines through the driver's own handler alone, so each is printed once.
    submitit configures its logger with handlers of its own on stdout (every level) and stderr (warnings), and
    the record also reaches the root logger's, so a warning would be printed three times."""
    import submitit  # noqa: F401  (its logger is configured as it is imported)

    log = logging.getLogger("submitit")
    for handler in list(log.handlers):
        log.removeHandler(handler)
