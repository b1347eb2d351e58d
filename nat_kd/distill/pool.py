"""Where and in how many processes the chunks are decoded: the device, the processes and threads (one process per
core on a CPU, or what the backend's policy says; on a GPU one, or ``--workers`` sharing it), and the loop that
decodes the pending chunks, here or in a pool of worker processes, saving each chunk as it finishes.

Workers start from multiprocessing's forkserver, never forked from this process: each loads its own loaded, and
nothing is inherited from a parent whose threads may be running. The server is a fresh interpreter that each
worker is forked from; where this process already runs one (the study's job server, nat_kd.engine.fairseq_jobs,
in a study's driver or the test suite), the workers fork from that with fairseq imported, instead of each
importing it (seconds a worker), and see that server's environment, from its start (every setting a worker
takes from the toolkit travels in its call).
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
from typing import Callable

from nat_kd.cli import quiet_worker
from nat_kd.errors import SettingsError
from nat_kd.machine import available_cores

from .autobatch import AUTO
from .backends import Backend, backend_class, register_backend
from .chunk_decoder import ChunkDecoder
from .config import DistillConfig
from .progress import ChunkStore
from .loaded import LoadedRun

Job = tuple[int, list[list[int]]]  # (chunk index, its batches)


def choose_device(cfg: DistillConfig) -> str:
    import torch

    if cfg.device == "auto":
        if torch.cuda.is_available():
            return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        return "cpu"
    return cfg.device


def parallelism(cfg: DistillConfig, device: str) -> tuple[int, int]:
    """(worker processes, threads per worker) on this machine."""
    if device != "cpu":
        # --workers N: N processes share the GPU, each with its own teacher; a small teacher's beam search leaves
        # the GPU idle between its steps (Python and small kernels), which the other processes fill
        return cfg.workers or 1, cfg.threads or 1
    # under torchrun, the ranks on this machine share its cores
    cores = max(1, available_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    workers = cfg.workers or backend_class(cfg.backend).cpu_workers or cores
    return workers, cfg.threads or max(1, cores // workers)


def reuse_freed_memory() -> None:
    """Serve big tensors from the heap and keep freed memory for reuse (glibc only).

    A beam step's scores are B*beam x V floats (about 40 MB at 3000 tokens, vocabulary 8k): above glibc's
    largest mmap threshold, so every step maps fresh pages that the kernel must zero, and two decoding
    processes then compete for memory bandwidth. With mmap off and no trimming, each step reuses the last
    step's pages; a worker keeps its peak memory until it exits (docs/results/generator_speed.md: what it saves).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "mallopt"):
        m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
        libc.mallopt(m_mmap_max, 0)
        libc.mallopt(m_trim_threshold, 2**31 - 1)


class OutOfGPUMemory(SettingsError):
    """The decoding did not fit the GPU's memory: the settings to lower, and that the saved chunks are kept."""


def out_of_gpu_memory(err: BaseException, cfg: DistillConfig, device: str, workers: int) -> OutOfGPUMemory | None:
    """``err`` as an OutOfGPUMemory if it is torch's or CTranslate2's out-of-memory error, else None."""
    import torch

    if not (isinstance(err, torch.cuda.OutOfMemoryError)
            or (isinstance(err, RuntimeError) and "CUDA failed with error out of memory" in str(err))):
        return None
    if cfg.max_tokens == AUTO:  # a bound that did not hold (autobatch.py)
        return OutOfGPUMemory(
            f"out of GPU memory on {device}, decoding the batches --max-tokens auto sized (plan.json's batching "
            f"in {cfg.out_dir}.partial) in {workers} process(es) on it; the chunks saved so far are kept. Rerun "
            "with fewer --workers to go on from them, or start again in smaller batches: --max-tokens a number "
            "below auto's and another --out")
    return OutOfGPUMemory(
        f"out of GPU memory on {device}, decoding batches of up to --max-tokens {cfg.max_tokens} tokens in "
        f"{workers} process(es) on it; the chunks saved so far are kept. Rerun with fewer --workers to go on "
        "from them, or start again in smaller batches: a smaller --max-tokens and another --out")


_WORKER = {}  # this worker process's ChunkDecoder, and what its out-of-memory error says


def _worker_init(cfg: DistillConfig, backend: type[Backend], threads: int, device: str, workers: int) -> None:
    """A worker process's start: the run's backend registered here too (a class registered in the parent
    from outside nat_kd arrives pickled by reference), then its own loaded and chunk decoder."""
    import torch

    torch.set_num_threads(threads)
    reuse_freed_memory()
    register_backend(backend)
    _WORKER["decoder"] = ChunkDecoder(LoadedRun(cfg, device), threads)
    _WORKER["settings"] = (cfg, device, workers)


def _worker_decode(job: Job):
    index, batches = job
    try:
        return index, _WORKER["decoder"].decode_chunk(batches)
    except Exception as err:
        # torch's error may not survive the pickling back to the parent; ours does, and reads as one line
        memory = out_of_gpu_memory(err, *_WORKER["settings"])
        if memory is None:
            raise
        raise memory from None


def decode_here(loaded: LoadedRun, jobs: list[Job], threads: int, save: Callable[[int, dict], None]) -> None:
    """Decode the chunks in this process. The next chunk is queued before this one is finished, so a backend
    that decodes in its own threads (CTranslate2; fairseq on a GPU) keeps them busy while this process
    detokenizes, scores and saves."""
    import torch

    torch.set_num_threads(threads)
    reuse_freed_memory()
    decoder = ChunkDecoder(loaded, threads)
    try:
        queued = None
        for index, batches in jobs:
            submitted = (index, decoder.submit_chunk(batches))
            if queued:
                save(queued[0], decoder.finish_chunk(queued[1]))
            queued = submitted
        if queued:
            save(queued[0], decoder.finish_chunk(queued[1]))
    except Exception as err:
        memory = out_of_gpu_memory(err, loaded.cfg, loaded.device, 1)
        if memory is None:
            raise
        raise memory from err
    finally:  # also on an error or Ctrl-C: no decoding thread is left running
        decoder.close()


def decode_in_pool(loaded: LoadedRun, jobs: list[Job], workers: int, threads: int,
                   save: Callable[[int, dict], None]) -> None:
    """Decode the chunks in ``workers`` processes from the forkserver, each with its own loaded."""
    context = multiprocessing.get_context("forkserver")
    setup = (_worker_init, (loaded.cfg, loaded.backend_type, threads, loaded.device, workers))
    with context.Pool(workers, initializer=quiet_worker, initargs=(pickle.dumps(setup),)) as pool:
        # longest chunks first (chunks are sorted by length), so no worker is left alone at the end
        for index, result in pool.imap_unordered(_worker_decode, jobs[::-1]):
            save(index, result)


def decode_pending(loaded: LoadedRun, store: ChunkStore, chunks, pending: list[int], workers: int,
                   threads: int, shard_label: str) -> int:
    """Decode the ``pending`` chunks, saving each as it finishes; returns the number of sentences decoded."""
    from tqdm import tqdm

    total = sum(len(b) for i in pending for b in chunks[i])
    bar = tqdm(total=total, unit="sent", desc=f"distil {shard_label}", disable=not loaded.cfg.progress_bar,
               dynamic_ncols=True, file=sys.stderr)
    jobs = [(i, chunks[i]) for i in pending]

    def save(index: int, result: dict) -> None:
        store.save(index, result)
        bar.update(len(result["ids"]))

    try:
        if workers <= 1 or len(jobs) <= 1:
            decode_here(loaded, jobs, threads, save)
        else:
            decode_in_pool(loaded, jobs, min(workers, len(jobs)), threads, save)
    finally:
        bar.close()
    return total
