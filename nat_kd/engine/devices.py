"""Where a local study's model jobs run (``python -m nat_kd.study --device``): on the CPU, or each on one of the
GPUs torch sees, the one running the fewest of the study's jobs at that moment, so that ``--jobs N`` puts N
jobs on one GPU, or spreads them over several.

A job is told its GPU the way a user tells a command: ``CUDA_VISIBLE_DEVICES`` in its environment
(fairseq_jobs.run_logged), so that it sees that one GPU alone and fairseq-train does not start its own
data-parallel training over every GPU there is. The device is no input of a step (its fingerprint leaves it
out): a record made on a GPU stands in for the step on the CPU and the other way round; the record names it.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

from nat_kd.errors import SettingsError

DEVICES = ("auto", "cpu", "cuda")
CPU = "cpu"


def gpu_count() -> int:
    """The GPUs torch sees here. In the driver only: the job server, from which the jobs are forked, must not
    initialise CUDA (a forked child could not use it), and the driver forks no job."""
    import torch

    return torch.cuda.device_count()


class Devices:
    """The devices a local study's jobs take turns on: ``--device`` resolved against the GPUs torch sees."""

    def __init__(self, device: str = "auto"):
        if device not in DEVICES:
            raise SettingsError(f"--device {device}: choose among {', '.join(DEVICES)}")
        count = gpu_count() if device != CPU else 0
        if device == "cuda" and not count:
            import torch

            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise SettingsError(f"--device cuda: torch {torch.__version__} sees no GPU"
                                + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
                                + ": run where one is, or use --device cpu")
        self.gpus = count
        self._running = [0] * count
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        return "cuda" if self.gpus else CPU

    @contextmanager
    def lease(self) -> Iterator[str]:
        """The device of one job while it runs: "cpu", or "cuda:N" for the GPU running the fewest jobs (the
        lowest such N)."""
        if not self.gpus:
            yield CPU
            return
        with self._lock:
            index = min(range(self.gpus), key=lambda i: (self._running[i], i))
            self._running[index] += 1
        try:
            yield f"cuda:{index}"
        finally:
            with self._lock:
                self._running[index] -= 1


def visible_devices(device: str | None) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` of a job on ``device`` ("cuda:N": the Nth GPU the driver sees, among those the
    driver's own CUDA_VISIBLE_DEVICES names, if any); None for "cpu" or None (the job's environment as it is)."""
    if device is None or not device.startswith("cuda:"):
        return None
    index = int(device.split(":", 1)[1])
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    return seen.split(",")[index].strip() if seen else str(index)
