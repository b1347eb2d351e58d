"""Where the raw corpus lives, and reading it safely.

The default corpus is Multi30k task 1 (raw, gzipped, line-aligned across en/de/fr/cs), found at
``$NAT_KD_DATA`` if set, else ``../shared/data/multi30k`` next to the project checkout, else in ``data/multi30k/``,
where ``nat_kd.prepare`` downloads it from https://github.com/multi30k/dataset (folder ``data/task1/raw/``) when
there is no local copy (``nat_kd.multi30k``).
"""
from __future__ import annotations

import codecs
import gzip
import os
import zlib
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

from .errors import NatKdError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = PROJECT_ROOT.parent / "shared" / "data" / "multi30k"
DOWNLOAD_DIR = PROJECT_ROOT / "data" / "multi30k"  # where nat_kd.prepare caches a downloaded Multi30k
LANGUAGES = ("en", "de", "fr", "cs")
GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip file


class CorpusError(NatKdError):
    """Bad input data: the message names the file, the line and the fix."""


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The raw corpus directory: an explicit override, else $NAT_KD_DATA, else the shared default, else the
    Multi30k that nat_kd.prepare downloaded into data/multi30k/ when there was none of these."""
    path = Path(override or os.environ.get("NAT_KD_DATA") or DEFAULT_DATA_DIR)
    if not (override or os.environ.get("NAT_KD_DATA") or path.is_dir()) and DOWNLOAD_DIR.is_dir():
        path = DOWNLOAD_DIR
    if not path.is_dir():
        raise CorpusError(
            f"corpus directory {path} does not exist. Pass --data-dir or set NAT_KD_DATA to a folder "
            "holding SPLIT.LANG(.gz) files, e.g. a copy of data/task1/raw/ from "
            "https://github.com/multi30k/dataset"
        )
    return path


def split_file(directory: Path, split: str, lang: str, option: str = "--data-dir") -> Path:
    """SPLIT.LANG.gz or plain SPLIT.LANG inside ``directory``; ``option`` is where the user gave that place (a
    folder, or a file prefix such as --trainpref), for the message when neither file is there."""
    candidates = [directory / f"{split}.{lang}.gz", directory / f"{split}.{lang}"]
    for path in candidates:
        if path.is_file():
            return path
    for path in candidates:
        if path.exists():
            raise CorpusError(f"{path} is not a file (a folder?); check {option}")
    raise CorpusError(f"no {candidates[0]} or {candidates[1]}; check {option} and the language pair")


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a (possibly gzipped) UTF-8 file one by one, without line ends: memory stays flat.

    A line ends with \\n or \\r\\n. A UTF-8 byte order mark at the start of the file is dropped, as Python's
    utf-8-sig codec drops it: it is not text, and would stick to the first word. A missing file, a directory,
    gzip content under a name without .gz (or the reverse), a damaged gzip file, invalid UTF-8 or a carriage
    return inside a line is a CorpusError naming the file (and line): fairseq-preprocess and sacrebleu read
    text with universal newlines, so a lone \\r would end a line for them but not here, and every later pair
    would be misaligned."""
    path = Path(path)
    if path.is_dir():
        raise CorpusError(f"{path}: is a directory, not a file; give the path of a text file in it")
    if not path.is_file():
        raise CorpusError(f"{path}: no such file; check the path")
    compressed = path.suffix == ".gz"
    with open(path, "rb") as raw:
        head = raw.read(2)
        if head and (head == GZIP_MAGIC) != compressed:
            raise CorpusError(f"{path}: this file is gzip-compressed: name it .gz" if not compressed else
                              f"{path}: this file is not gzip-compressed, though its name ends with .gz: drop the "
                              ".gz from its name, or compress it")
    with (gzip.open if compressed else open)(path, "rb") as handle:
        for number, line in enumerate(_gzip_checked(handle, path) if compressed else handle, 1):
            line = line.removesuffix(b"\n").removesuffix(b"\r")
            if number == 1:
                line = line.removeprefix(codecs.BOM_UTF8)
            if b"\r" in line:
                raise CorpusError(f"{path}:{number}: a carriage return (\\r) inside the line, which fairseq and "
                                  "sacrebleu would read as a line break; remove them, e.g. tr -d '\\r' < IN > OUT")
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CorpusError(f"{path}:{number}: invalid UTF-8 ({err.reason} at byte {err.start}); "
                                  "re-encode the file as UTF-8") from None


def _gzip_checked(handle, path: Path) -> Iterator[bytes]:
    """The lines of a gzip file; a damaged or cut-off one is a CorpusError naming the file."""
    try:
        yield from handle
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise CorpusError(f"{path}: damaged gzip file ({err}); copy or compress it again") from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a (possibly gzipped) UTF-8 file (see ``iter_lines``)."""
    return list(iter_lines(path))


def iter_parallel(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Source and target lines pair by pair (memory stays flat); once read to the end, a CorpusError if they
    are not line-aligned (same count)."""
    sources = targets = 0
    for src, tgt in zip_longest(iter_lines(src_path), iter_lines(tgt_path)):
        sources += src is not None
        targets += tgt is not None
        if src is not None and tgt is not None:
            yield src, tgt
    if sources != targets:
        raise CorpusError(f"line-count mismatch: {src_path} has {sources} lines but {tgt_path} has {targets}; "
                          "parallel files must be line-aligned")


def read_parallel(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    """Source and target lines, which must be line-aligned (same count)."""
    pairs = list(iter_parallel(src_path, tgt_path))
    return [src for src, _ in pairs], [tgt for _, tgt in pairs]
