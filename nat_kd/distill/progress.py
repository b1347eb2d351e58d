"""Progress on disk: a decode is a fixed plan of chunks (groups of batches), each saved atomically when done.

A run killed at any moment loses at most the chunks in flight; rerun with the same command, it decodes only
the missing chunks. The chunks are the same batches whatever the run, shard or worker that decodes them, so
the merged output is identical to an uninterrupted run's. Shard k of n owns chunks k, k+n, k+2n, ...
(chunks are ordered by source length, so shards get similar work).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from nat_kd import atomic
from nat_kd.errors import NatKdError


# Bump when a change makes old partial progress unusable.
# 2: batches as fairseq-generate's (reference lengths too); 3: per-line scores, or backends and empty sources;
# 4: both (a chunk's scores hold the backend's log-probability)
PROGRESS_VERSION = 4


class ProgressError(NatKdError):
    """The saved progress does not fit this command, or a shard is missing."""


def plan_chunks(batches: list[list[int]], chunk_sentences: int) -> list[list[list[int]]]:
    """Consecutive batches grouped into chunks of at least ``chunk_sentences`` sentences (the last may be less)."""
    chunks, current, size = [], [], 0
    for batch in batches:
        current.append([int(i) for i in batch])
        size += len(batch)
        if size >= chunk_sentences:
            chunks.append(current)
            current, size = [], 0
    if current:
        chunks.append(current)
    return chunks


class ChunkStore:
    """``<out>.partial/``: plan.json (fingerprint + chunks) and chunk-NNNNNN.json results."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)

    def chunk_path(self, index: int) -> Path:
        return self.dir / f"chunk-{index:06d}.json"

    def open_plan(self, fingerprint: dict, chunks: list, batching: dict | None = None) -> list:
        """Write the plan (with ``batching``: the batch limits --max-tokens auto chose for it), or check an
        existing one was made by the same command; returns the chunks."""
        plan_file = self.dir / "plan.json"
        if plan_file.is_file():
            saved = json.loads(plan_file.read_text(encoding="utf-8"))
            if saved["fingerprint"] != fingerprint:
                changed = sorted(k for k in set(saved["fingerprint"]) | set(fingerprint)
                                 if saved["fingerprint"].get(k) != fingerprint.get(k))
                raise ProgressError(
                    f"{self.dir} holds progress of a different run (changed: {', '.join(changed)}). Rerun the "
                    "original command to finish it, or delete that folder to start over")
            return saved["chunks"]
        atomic.write_json(plan_file, {"fingerprint": fingerprint, "chunks": chunks,
                                      **({"batching": batching} if batching else {})})
        return chunks

    def saved_batching(self, fingerprint: dict) -> dict | None:
        """The batching recorded with a saved plan of the same command (--max-tokens auto's choice), if any: a
        rerun decodes the saved plan's batches, whatever the GPU's free memory is now."""
        plan_file = self.dir / "plan.json"
        if not plan_file.is_file():
            return None
        saved = json.loads(plan_file.read_text(encoding="utf-8"))
        return saved.get("batching") if saved["fingerprint"] == fingerprint else None

    def is_done(self, index: int) -> bool:
        return self.chunk_path(index).is_file()

    def save(self, index: int, result: dict) -> None:
        atomic.write_text(self.chunk_path(index), json.dumps(result, ensure_ascii=False) + "\n")

    def load(self, index: int) -> dict:
        return json.loads(self.chunk_path(index).read_text(encoding="utf-8"))

    def missing(self, n_chunks: int) -> list[int]:
        return [i for i in range(n_chunks) if not self.is_done(i)]

    def check_complete(self, n_chunks: int, num_shards: int) -> None:
        missing = self.missing(n_chunks)
        if missing:
            shards = sorted({i % num_shards for i in missing})
            raise ProgressError(
                f"{len(missing)} of {n_chunks} chunks are not decoded yet (shard ids {shards} of {num_shards}); "
                f"run those shards (same command with --shard-id) before merging. Progress: {self.dir}")

    @contextmanager
    def merge_lock(self):
        """Yields True to the one process allowed to merge now; the lock dies with its holder (flock)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "merge.lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def shard_chunks(n_chunks: int, shard_id: int, num_shards: int) -> list[int]:
    return list(range(shard_id, n_chunks, num_shards))


def shard_from_env(num_shards: int | None, shard_id: int | None) -> tuple[int, int]:
    """Explicit --num-shards/--shard-id, else torchrun's RANK/WORLD_SIZE, else one shard."""
    if num_shards is None and "WORLD_SIZE" in os.environ:
        num_shards, shard_id = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
    num_shards = num_shards or 1
    shard_id = shard_id or 0
    if not 0 <= shard_id < num_shards:
        raise ProgressError(f"--shard-id must be in [0, {num_shards}), got {shard_id}")
    return num_shards, shard_id
