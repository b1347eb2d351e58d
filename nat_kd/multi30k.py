"""Multi30k task 1 where no local copy is found: the raw files a language pair needs, downloaded from the dataset's
public repository, checked against their sha256 and cached under ``data/multi30k/``.

Where ``nat_kd.prepare`` reads Multi30k from, the first place found:

1. ``--data-dir DIR``, else the environment variable ``NAT_KD_DATA`` (a missing folder there is an error, never
   a download), else ``../shared/data/multi30k`` beside the checkout: a local copy, always used first;
2. ``data/multi30k/``, with the files the pair needs downloaded there first when they are not already:
   ``{train,val,test_2016_flickr}.{SRC,TGT}.gz`` from ``MULTI30K_URL`` (or ``$NAT_KD_MULTI30K_URL``, for a
   mirror), each one written to a temporary file, checked against ``SHA256`` and only then renamed into place,
   so that a corrupt or interrupted download leaves nothing behind and the next run downloads it again.

Offline, or on any failed download, the run stops with one line (exit status 2) that says how to point at a
local copy instead.
"""
from __future__ import annotations

import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from . import atomic, corpus
from .corpus import CorpusError
from .errors import NatKdError, SettingsError
from .hashing import sha256_file

logger = logging.getLogger("nat_kd.multi30k")

URL_ENV = "NAT_KD_MULTI30K_URL"
# data/task1/raw/ of https://github.com/multi30k/dataset, at a fixed commit of its master branch, so that the files
# stay the ones whose checksums are below
MULTI30K_URL = ("https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/"
                "data/task1/raw/")
TIMEOUT_S = 60  # seconds without a byte (connecting or reading) before a download counts as failed
SPLITS = ("train", "val", "test_2016_flickr")
# sha256 of each raw file: `sha256sum *.gz` over the local copy of data/task1/raw/ in ../shared/data/multi30k, the
# repository's files unchanged (the en and de ones agree with other public projects' pins of the same commit).
# tests/test_fetch_multi30k.py checks the table against that copy.
SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}


class FetchError(CorpusError, SettingsError):
    """No local Multi30k, and downloading it failed: the message says how to point at a local copy."""


class _Failed(Exception):
    """One download failed; the argument says why, in a few words."""


def needed_files(languages: Iterable[str]) -> list[str]:
    """The raw files of ``languages`` for every split prepare reads, e.g. train.en.gz."""
    return [f"{split}.{lang}.gz" for split in SPLITS for lang in languages]


def base_url() -> str:
    """Where the files are downloaded from: ``$NAT_KD_MULTI30K_URL`` (a mirror) or the public repository."""
    url = os.environ.get(URL_ENV) or MULTI30K_URL
    return url if url.endswith("/") else url + "/"


def raw_dir(override: str | os.PathLike | None, languages: Iterable[str]) -> Path:
    """The Multi30k folder to read ``languages`` from: a local copy (``--data-dir``, ``$NAT_KD_DATA`` or the shared
    default) when there is one, else ``data/multi30k/`` with whatever it lacks downloaded first."""
    if override or os.environ.get("NAT_KD_DATA") or corpus.DEFAULT_DATA_DIR.is_dir():
        return corpus.data_dir(override)
    return fetch(needed_files(languages))


def _is_cached(path: Path) -> bool:
    if not path.is_file():
        return False
    if sha256_file(path) == SHA256[path.name]:
        return True
    logger.warning("%s is not the published file (its sha256 differs): downloading it again", path)
    return False


def fetch(names: Iterable[str], cache: str | os.PathLike | None = None) -> Path:
    """``cache`` (default ``data/multi30k/``) holding the raw files ``names``, each downloaded from ``base_url()``
    unless a checked copy is already there; a FetchError if one fails, with nothing of that file left in ``cache``
    (the files checked before it are kept)."""
    cache = Path(cache or corpus.DOWNLOAD_DIR)
    url = base_url()
    missing = [name for name in names if not _is_cached(cache / name)]
    if not missing:
        logger.info("Multi30k: no local copy, reading the files downloaded earlier into %s (sha256 checked)", cache)
        return cache
    logger.info("Multi30k: no local copy (no --data-dir, no NAT_KD_DATA, no %s): downloading %d files from %s "
                "into %s", corpus.DEFAULT_DATA_DIR, len(missing), url, cache)
    for name in missing:
        try:
            size = _download(url + name, cache / name, SHA256[name])
        except _Failed as err:
            if cache.is_dir() and not any(cache.iterdir()):
                cache.rmdir()  # made for this download: nothing is left of it
            raise FetchError(
                f"no local Multi30k, and downloading {url + name} failed: {err}; nothing of it was kept. Set "
                f"NAT_KD_DATA or pass --data-dir to a folder holding Multi30k's SPLIT.LANG.gz files (data/task1/raw/ "
                f"of https://github.com/multi30k/dataset), or rerun online") from None
        logger.info("Multi30k: %s from %s (%d bytes, sha256 checked) into %s", name, url + name, size, cache)
    return cache


def _download(url: str, path: Path, sha256: str) -> int:
    """``url`` into ``path`` through a temporary file beside it, renamed into place only when complete and its
    sha256 is ``sha256``; returns its size. A _Failed says why it was not."""
    try:
        with atomic.replacing(path) as tmp:
            digest, size = hashlib.sha256(), 0
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(tmp, "wb") as out:
                length = response.headers.get("Content-Length")
                while block := response.read(1 << 16):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
                out.flush()
                os.fsync(out.fileno())
            # http.client ends a body cut short without an error: the announced length tells
            if length is not None and length.isdigit() and size != int(length):
                raise _Failed(f"the connection closed after {size} of {length} bytes")
            if digest.hexdigest() != sha256:
                raise _Failed(f"its sha256 is {digest.hexdigest()}, not the published file's {sha256} (corrupt, "
                              "or not that file)")
        return size
    except (_Failed, NatKdError):
        raise
    except urllib.error.URLError as err:  # an HTTPError says its status; other URLErrors carry a reason
        raise _Failed(_one_line(err if isinstance(err, urllib.error.HTTPError) else err.reason)) from None
    except (OSError, http.client.HTTPException, ValueError) as err:  # a reset, a timeout, a malformed URL
        raise _Failed(_one_line(err)) from None


def _one_line(reason) -> str:
    text = " ".join(str(reason).split())
    return f"{type(reason).__name__}: {text}" if isinstance(reason, BaseException) and text else text or repr(reason)
