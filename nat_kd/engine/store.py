"""A study's store: each finished step's record and the small outputs that later steps read, kept in a folder
under version control (a results page, e.g. docs/results/ladder/), so that a study whose folder was lost
resumes from it without retraining what those outputs came from.

    STORE/steps/NAME.json    the step's record, the study folder written as DIR
    STORE/kept/NAME.tar.xz   the files of the step's work folder that it keeps (a distilled set's targets, a
                             student's hypotheses); the record's "kept" holds the archive's digest and the
                             digest of each file the step's rebuild makes again beside them (a set's bin/;
                             a .json or .md with the study folder written as DIR, as below)
    STORE/results/           the study's results folder as last rendered (results.md, results.json, the
                             figures), the study folder written as DIR, so that the page beside it links to
                             the figure and tables of the steps committed

In a kept .json or .md file (a set's meta.json and card) the study folder is written as DIR too, so that an
archive does not depend on where its study ran and a set restored elsewhere names its own folder; the record's
"relocated" lists those files (one that held "DIR/" already is kept as it is).

Checkpoints are never kept: a step restored without its outputs (a teacher) counts as done from its record
only while no step that is still to run reads them (nat_kd.engine.runner).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import lzma
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nat_kd import atomic
from nat_kd.errors import NatKdError
from nat_kd.hashing import sha256_file

logger = logging.getLogger("nat_kd.study")

PLACEHOLDER = "DIR"  # the study folder, in a stored record
MAX_FILE_BYTES = 2 * 1024 * 1024  # an archive larger than this is not kept (a repository is no data store)
MAX_STORE_BYTES = 30 * 1024 * 1024  # a warning past this, for the whole store
RESULTS = "results"  # STORE/results/


class StoreError(NatKdError):
    """A stored file that cannot be used; the message names it and what to do."""


@dataclass
class Kept:
    """What a step keeps of its work folder: ``files`` (archived) and ``rebuilt`` (made again from them and from
    the step's dependencies by the step's rebuild, and checked by digest), each relative to the folder."""
    files: list[Path]
    rebuilt: list[Path] = field(default_factory=list)


def _to_placeholder(record: dict, study: Path) -> dict:
    root = json.dumps(str(study))[1:-1]
    return json.loads(json.dumps(record).replace(f'"{root}/', f'"{PLACEHOLDER}/').replace(f'"{root}"',
                                                                                        f'"{PLACEHOLDER}"'))


def _from_placeholder(record: dict, study: Path) -> dict:
    root = json.dumps(str(study))[1:-1]
    return json.loads(json.dumps(record).replace(f'"{PLACEHOLDER}/', f'"{root}/').replace(f'"{PLACEHOLDER}"',
                                                                                         f'"{root}"'))


RELOCATED_SUFFIXES = (".json", ".md")  # the kept files that name paths: meta.json, card.json, CARD.md


def _roots(study: Path, name: str) -> tuple[bytes, bytes]:
    """The study folder as file ``name`` writes it (escaped in JSON), and DIR, each with its trailing slash."""
    root = json.dumps(str(study))[1:-1] if name.endswith(".json") else str(study)
    return f"{root}/".encode(), f"{PLACEHOLDER}/".encode()


def _rebuilt_digest(path: Path, name: str, study: Path) -> str:
    """sha256 of a file the step's rebuild makes, with the study folder written as DIR where it is a .json or .md
    (a Selective KD set's card, copied from its distilled set's, names the teacher's checkpoint by path), so that
    the file rebuilt in another study folder matches the record."""
    if not name.endswith(RELOCATED_SUFFIXES):
        return sha256_file(path)
    return hashlib.sha256(path.read_bytes().replace(*_roots(study, name))).hexdigest()


def _archive(folder: Path, files: list[Path], study: Path) -> tuple[bytes, list[str]]:
    """The files as an xz-compressed tar whose bytes depend only on their names and contents (no times, owners
    or modes), so that an unchanged output leaves the committed archive unchanged; and the files in which the
    study folder was written as DIR."""
    buffer, relocated = io.BytesIO(), []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(str(f) for f in files):
            info = tarfile.TarInfo(name)
            data = (folder / name).read_bytes()
            root, placeholder = _roots(study, name)
            if name.endswith(RELOCATED_SUFFIXES) and root in data and placeholder not in data:
                data = data.replace(root, placeholder)
                relocated.append(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME), relocated


def _relocated_text(text: str, study: Path, replacements: dict[str, str]) -> str:
    """``text`` with each key of ``replacements`` (exact text) written as its value, then the study folder as DIR
    wherever it stands as a whole path or a path's start (as is and as JSON escapes it)."""
    for old, new in replacements.items():
        text = text.replace(old, new)
    for root in dict.fromkeys((str(study), json.dumps(str(study))[1:-1])):
        text = re.sub(re.escape(root) + r"(?![\w.-])", PLACEHOLDER, text)
    return text


class Store:
    """A store folder (module docstring), for the study in folder ``study``."""

    def __init__(self, root: str | os.PathLike, study: str | os.PathLike):
        self.root, self.study = Path(root), Path(study)

    def record_file(self, name: str) -> Path:
        return self.root / "steps" / f"{name}.json"

    def archive_file(self, name: str) -> Path:
        return self.root / "kept" / f"{name}.tar.xz"

    def record(self, name: str) -> dict | None:
        """The stored record of step ``name``, with this study's folder for DIR; None if there is none."""
        path = self.record_file(name)
        if not path.is_file():
            return None
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise StoreError(f"{path}: not a step record ({err}); restore it from git or delete it") from None
        return _from_placeholder(stored, self.study)

    def records(self) -> dict[str, dict]:
        """Every stored record, by step name."""
        folder = self.root / "steps"
        return {p.stem: self.record(p.stem) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}

    def restores_outputs(self, stored: dict, work: Path) -> bool:
        """Whether restoring the stored record into the step's ``work`` folder gives back every output it names
        (a distilled set), not only its record (a teacher, whose checkpoint is never kept)."""
        kept = stored.get("kept") or {}
        files = {*kept.get("files", ()), *kept.get("rebuilt", {})}
        outputs = [Path(p) for p in stored["result"].get("outputs", [])]
        return bool(outputs) and all(p.is_relative_to(work) and str(p.relative_to(work)) in files for p in outputs)

    def save(self, record: dict, work: Path, kept: Kept | None) -> None:
        """Store ``record`` and, with ``kept``, its archive of the work folder's files; unchanged files are not
        rewritten. An archive over MAX_FILE_BYTES is left out, with a warning: the step then counts as done
        from its record only while no later step reads its outputs."""
        name = record["name"]
        stored = {k: v for k, v in record.items() if k not in ("restored", "kept")}
        if kept is not None and not kept.files:  # a record alone (a training without hypotheses)
            stored["kept"] = {"files": [], "rebuilt": {}}
        elif kept is not None:
            data, relocated = _archive(work, kept.files, self.study)
            if len(data) > MAX_FILE_BYTES:
                logger.warning("%s: %.1f MB compressed, over the %d MB a kept file may have: not kept",
                               name, len(data) / 2**20, MAX_FILE_BYTES // 2**20)
                stored["kept"] = None
            else:
                stored["kept"] = {"archive": f"kept/{name}.tar.xz", "sha256": hashlib.sha256(data).hexdigest(),
                                  "files": sorted(str(f) for f in kept.files), "relocated": relocated,
                                  "rebuilt": {str(f): _rebuilt_digest(work / f, str(f), self.study)
                                              for f in sorted(kept.rebuilt)}}
                archive = self.archive_file(name)
                if not archive.is_file() or archive.read_bytes() != data:
                    archive.parent.mkdir(parents=True, exist_ok=True)
                    with atomic.replacing(archive) as tmp:
                        tmp.write_bytes(data)
        stored = _to_placeholder(stored, self.study)
        path = self.record_file(name)
        text = json.dumps(stored, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(path, text)
        total = sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
        if total > MAX_STORE_BYTES:
            logger.warning("the store %s holds %.1f MB, over the %d MB a study's store should", self.root,
                           total / 2**20, MAX_STORE_BYTES // 2**20)

    def keep_results(self, results: Path, replacements: dict[str, str]) -> Path:
        """Copy the study's rendered ``results`` folder into STORE/results/: its .md and .json files relocated
        (_relocated_text: ``replacements`` such as the command as the committed page shows it, then the study
        folder as DIR), the figures byte for byte. Unchanged files are not rewritten and each file is replaced
        whole; a file the rendering no longer makes is removed. Returns STORE/results/."""
        target, made = self.root / RESULTS, set()
        for path in sorted(p for p in results.rglob("*") if p.is_file()):
            name = path.relative_to(results)
            made.add(name)
            data = path.read_bytes()
            if path.suffix in RELOCATED_SUFFIXES:
                data = _relocated_text(data.decode("utf-8"), self.study, replacements).encode("utf-8")
            if not (target / name).is_file() or (target / name).read_bytes() != data:
                with atomic.replacing(target / name) as tmp:
                    tmp.write_bytes(data)
        for path in [p for p in target.rglob("*") if p.is_file() and p.relative_to(target) not in made]:
            path.unlink()
        for folder in sorted((p for p in target.rglob("*") if p.is_dir()), reverse=True):  # deepest first
            if not any(folder.iterdir()):
                folder.rmdir()
        return target

    def restore(self, stored: dict, work: Path, results: dict, rebuild: Callable[[Path, dict], None] | None) -> None:
        """Unpack the stored record's archive into ``work`` (replaced whole), rebuild the rest from the
        dependencies' ``results`` and check every file against its stored digest; a file that does not match is
        a StoreError naming it, and ``work`` is left as it was."""
        kept = stored["kept"]
        if not kept["files"]:
            return
        archive = self.archive_file(stored["name"])
        if not archive.is_file():
            raise StoreError(f"{archive}: missing, though {self.record_file(stored['name'])} names it; restore it "
                             "from git, or delete the record to run the step again")
        data = archive.read_bytes()
        if hashlib.sha256(data).hexdigest() != kept["sha256"]:
            raise StoreError(f"{archive}: its sha256 is not the one {self.record_file(stored['name'])} records, so "
                             "it is not that step's output; restore both from git, or delete both to run the step "
                             "again")
        with atomic.building_directory(work) as tmp:
            with tarfile.open(fileobj=io.BytesIO(lzma.decompress(data)), mode="r") as tar:
                names = sorted(m.name for m in tar.getmembers())
                if names != kept["files"]:
                    raise StoreError(f"{archive}: holds other files than its record names; restore both from git")
                tar.extractall(tmp, filter="data")
            for name in kept.get("relocated", []):
                root, placeholder = _roots(self.study, name)
                (tmp / name).write_bytes((tmp / name).read_bytes().replace(placeholder, root))
            if rebuild is not None:
                rebuild(tmp, results)
            for name, digest in kept["rebuilt"].items():
                if not (tmp / name).is_file() or _rebuilt_digest(tmp / name, name, self.study) != digest:
                    raise StoreError(f"{archive}: {name} rebuilt from it differs from the step's own (its sha256); "
                                     "the inputs it is rebuilt from changed: delete the archive and its record to "
                                     "run the step again")
        logger.info("restored %s from %s", stored["name"], archive)
