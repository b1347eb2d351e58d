"""Content hashes (sha256, hex) behind the toolkit's fingerprints: a cached result is reused only when the
hash of everything it was made from is unchanged."""
from __future__ import annotations

import hashlib
import json
import os


def sha256_file(path: str | os.PathLike) -> str:
    """A file's bytes, read in 1 MiB blocks (checkpoints can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths) -> str:
    """Files' names and bytes, not the folders they lie in: what a step's dependants see of its outputs, so a
    study folder moved elsewhere (or another study's, reused) keeps its digests."""
    return sha256_json(sorted((os.path.basename(str(p)), sha256_file(p)) for p in paths))


def sha256_json(data) -> str:
    """A JSON-serialisable value, key order ignored (values json cannot hold are hashed as their str)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
