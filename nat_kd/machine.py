"""What this machine offers the toolkit's processes."""
from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its affinity: a cluster job's share, not the whole node)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
