"""What every nat_kd command line shares: its logging set-up, and the toolkit's errors as exit status 2."""
from __future__ import annotations

import logging
import sys
from typing import Callable

from .errors import NatKdError

LOG_FORMAT = "%(asctime)s | %(name)s | %(message)s"


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def is_toolkit_error(err: BaseException) -> bool:
    """A NatKdError, or the fairseq plugin's TeacherError (looked up only if the plugin is loaded: an error
    of a module that was never imported cannot have been raised)."""
    if isinstance(err, NatKdError):
        return True
    plugin = sys.modules.get("fairseq_plugins.teacher")
    return plugin is not None and isinstance(err, plugin.TeacherError)


def run(body: Callable[[], int | None]) -> int:
    """Run a command's body; the toolkit's own errors become ``error: ...`` on stderr and exit status 2.

    Anything else propagates with its traceback: a plain ValueError or KeyError is a bug to fix, not a message
    for the user."""
    try:
        return body() or 0
    except Exception as err:
        if not is_toolkit_error(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
