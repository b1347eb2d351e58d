"""What every nat_kd command line shares: its logging set-up (``--verbose``), and the toolkit's errors as exit
status 2."""
from __future__ import annotations

import argparse
import logging
import os
import pickle
import signal
import sys
import threading
from contextlib import contextmanager, nullcontext
from typing import Callable, Sequence

from .errors import NatKdError

LOG_FORMAT = "%(asctime)s | %(name)s | %(message)s"  # a warning's or an error's message starts with its level
VERBOSE = "--verbose"
# fairseq's loggers: their INFO lines (model loading, task set-up, and the "Please install tensorboardX" that
# fairseq.tasks.text_to_speech logs when it is imported) are shown only with --verbose
FAIRSEQ_LOGGERS = ("fairseq", "fairseq_cli")
STOPPED = "stopped; rerun the same command to go on"


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(VERBOSE, action="store_true", help="show fairseq's INFO messages too (default: only its "
                        "warnings and errors, between the toolkit's own lines)")


class LevelFormatter(logging.Formatter):
    """``fmt`` as it is for INFO lines; from WARNING up the message starts with the level ("WARNING: ..."), so
    that a warning does not read like one more info line."""

    def __init__(self, fmt: str):
        super().__init__(fmt)
        self.flagged = logging.Formatter(fmt.replace("%(message)s", "%(levelname)s: %(message)s"))

    def format(self, record: logging.LogRecord) -> str:
        return self.flagged.format(record) if record.levelno >= logging.WARNING else super().format(record)


def setup_logging(argv: Sequence[str] | None = None, fmt: str = LOG_FORMAT) -> None:
    """The toolkit's INFO lines, and fairseq's from WARNING up unless ``--verbose`` is in ``argv`` (default:
    sys.argv).

    Called first thing in a command's main, before its parser is built: building one can import fairseq
    (the generator adds the options of fairseq's encoders), whose import logs already; --help among them.
    Once the root handler is ours, the ``logging.basicConfig`` calls that fairseq's modules make when imported
    change nothing (and a handler already there, such as pytest's, is kept)."""
    verbose = VERBOSE in (sys.argv[1:] if argv is None else argv)
    handler = logging.StreamHandler()
    handler.setFormatter(LevelFormatter(fmt))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    for name in FAIRSEQ_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


def quiet_worker(call: bytes) -> None:
    """A worker process's initializer (multiprocessing.Pool's, from the forkserver): its logging silenced up to
    WARNING (the main process has shown the same loading messages once), then ``call``, a pickled (function,
    arguments), run. The call travels pickled so that its modules are imported only now: fairseq, among them,
    logs as it is imported ("Please install tensorboardX"), and the arguments of a plain initializer are
    unpickled, and their modules imported, before it runs."""
    logging.disable(logging.WARNING)
    function, args = pickle.loads(call)
    function(*args)


def is_toolkit_error(err: BaseException) -> bool:
    """A NatKdError, or the fairseq plugin's TeacherError (looked up only if the plugin is loaded: an error
    of a module that was never imported cannot have been raised)."""
    if isinstance(err, NatKdError):
        return True
    plugin = sys.modules.get("fairseq_plugins.teacher")
    return plugin is not None and isinstance(err, plugin.TeacherError)


@contextmanager
def _stopped_line_on_sigterm():
    """SIGTERM (a kill, the end of a job the command runs in) prints STOPPED, then ends the command as SIGTERM
    does: at once, so that the processes it started watching it end with it (the study's local steps). A driver
    of cluster jobs turns SIGTERM into Ctrl-C instead (nat_kd.launch.signals.sigterm_as_interrupt), to cancel its jobs.
    A handler can only be set from the main thread: elsewhere (a test's thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum, frame):
        print(STOPPED, file=sys.stderr, flush=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Terminated(BaseException):
    """SIGTERM, raised by ``cleaning_up_on_sigterm``: a BaseException, so that no ``except Exception`` stops it."""


@contextmanager
def cleaning_up_on_sigterm():
    """SIGTERM while the block runs raises ``Terminated``, so that what the block cleans up on the way out runs
    (the temporary files and folders of nat_kd.atomic, removed), then ends the command as SIGTERM does. Further
    SIGTERMs are ignored meanwhile: they would cut that clean-up short. Elsewhere than in the main thread
    nothing changes (see ``_stopped_line_on_sigterm``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        signal.signal(signum, signal.SIG_IGN)
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(body: Callable[[], int | None], resumable: bool = False) -> int:
    """Run a command's body; the toolkit's own errors become ``error: ...`` on stderr and exit status 2.

    Anything else propagates with its traceback: a plain ValueError or KeyError is a bug to fix, not a message
    for the user. A ``resumable`` command (every write atomic, every finished step kept) answers Ctrl-C, or a
    SIGTERM turned into one, wherever it comes, with STOPPED and exit status 130, and a plain SIGTERM with
    STOPPED before it ends."""
    try:
        with _stopped_line_on_sigterm() if resumable else nullcontext():
            return body() or 0
    except KeyboardInterrupt:
        if not resumable:
            raise
        print(STOPPED, file=sys.stderr)
        return 130
    except Exception as err:
        if not is_toolkit_error(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
