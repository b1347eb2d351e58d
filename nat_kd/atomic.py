"""Write files and directories so that a crash never leaves a half-written result behind."""
from __future__ import annotations

import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import SettingsError


def check_output_folder(folder: str | os.PathLike, output: str | os.PathLike | None = None) -> None:
    """Refuse a folder to write into that a file stands in the place of (the folder or one above it): called
    before the work, so that it fails at once rather than after. ``output``: what is to be written there, for
    the message (default: the folder itself)."""
    folder = Path(folder)
    output = Path(output or folder)
    for place in (folder, *folder.parents):
        if place.exists():
            if not place.is_dir():
                within = "" if place == output else f", so {output} cannot be written"
                raise SettingsError(f"{place} is a file, not a folder{within}: choose another path or move {place}")
            return


def check_output_file(path: str | os.PathLike) -> None:
    """Refuse an output file path that is a folder or lies under a file (``check_output_folder``)."""
    path = Path(path)
    if path.is_dir():
        raise SettingsError(f"{path} is a folder, not a file: give a file path, e.g. {path / 'NAME'}")
    check_output_folder(path.parent, path)


def check_replaceable(folder: str | os.PathLike, marker: str, what: str, option: str) -> None:
    """Refuse an output folder that ``building_directory`` would replace though it holds something else: it may
    be absent, empty, or ``what`` (an earlier output of the same command, recognised by its file ``marker``)."""
    folder = Path(folder)
    check_output_folder(folder)
    if folder.is_dir() and any(folder.iterdir()) and not (folder / marker).is_file():
        raise SettingsError(f"{option} {folder} exists and is not {what} (no {marker}); it would be replaced: "
                            f"choose another {option} or delete it")


def _new_beside(path: Path, suffix: str, create) -> Path:
    """A new hidden name beside ``path``, .NAME.RANDOM``suffix``, made by ``create`` (an exclusive os.open, or
    os.mkdir). Not tempfile's mkstemp or mkdtemp: their 0o600 and 0o700 would stay on the output, unreadable
    to the other users of a shared machine; a plain open or mkdir gives what the umask allows, as any file."""
    while True:
        name = path.with_name(f".{path.name}.{secrets.token_hex(4)}{suffix}")
        try:
            create(name)
            return name
        except FileExistsError:  # another writer's temporary name: draw again
            continue


@contextmanager
def replacing(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``, on failure removed.

    For writers that open the file themselves (matplotlib, numpy). The temporary name ends with ``path``'s
    suffix, so a writer that picks its format by the file name picks the right one."""
    path = Path(path)
    check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_beside(path, f".tmp{path.suffix}",
                      lambda name: os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def writing(path: str | os.PathLike):
    """A text handle (UTF-8, ``\\n`` line ends) on a temporary file beside ``path``, renamed into place when the
    block succeeds: for output written piece by piece (a corpus-sized alignment file)."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to a temporary file beside ``path``, then rename it into place."""
    with writing(path) as handle:
        handle.write(text)


def write_json(path: str | os.PathLike, data) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


@contextmanager
def building_directory(final: str | os.PathLike):
    """Yield a fresh temporary directory; on success it replaces ``final`` whole, on failure it is removed."""
    final = Path(final).resolve()  # "." or "dir/..": their name is empty or not the folder's own
    check_output_folder(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_beside(final, ".tmp", os.mkdir)
    try:
        yield tmp
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(new: Path, final: Path) -> None:
    """Rename the folder ``new`` onto ``final``; if that fails, ``final`` is left as it was."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    try:
        os.replace(new, final)
    except BaseException:
        if old.exists():
            os.replace(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def remove_stale_builds(final: str | os.PathLike) -> None:
    """Remove what ``building_directory(final)`` left beside ``final`` when its process was killed mid-write."""
    final = Path(final)
    for stale in final.parent.glob(f".{final.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def build_once(final: str | os.PathLike, build) -> Path:
    """``final``, a folder built by ``build(work_dir)`` the first time it is asked for and renamed into place
    whole; a second process asking meanwhile (another shard, a worker) waits for the first one's build."""
    import fcntl

    final = Path(final)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not final.is_dir():
            with building_directory(final) as work:
                build(work)
    return final
