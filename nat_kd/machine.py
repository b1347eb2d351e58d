"""What this machine offers the toolkit's processes."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path


def available_cores() -> int:
    """The cores this process may run on (its affinity: a cluster job's share, not the whole node)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _first_gpu() -> str | None:
    """The first GPU's name from nvidia-smi, not from torch: torch.cuda.get_device_name initialises CUDA in this
    process, and a study's driver forks its job servers after a step's record is written (a forked child cannot
    use CUDA then)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        names = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                               timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    return names[0].strip() or None


def hardware() -> dict:
    """The CPU model, the cores this process may use, the first GPU and the software versions: what a wall
    time was measured on."""
    import torch

    from nat_kd import __version__

    cpuinfo = Path("/proc/cpuinfo")
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if cpuinfo.exists() else platform.processor()
    return {"cpu": cpu, "cores": available_cores(), "gpu": _first_gpu(),
            "python": platform.python_version(), "torch": torch.__version__, "nat_kd": __version__}
