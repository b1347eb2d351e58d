"""Atomic output: a file or folder appears whole or not at all, whatever the path given and wherever it fails."""
import os

import pytest

from nat_kd import atomic
from nat_kd.errors import SettingsError


def test_building_directory_accepts_the_current_folder(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    monkeypatch.chdir(out)
    with atomic.building_directory(".") as work:
        (work / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left beside it
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]


def test_a_failed_swap_leaves_the_old_folder_and_no_temporary_one(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("disk gone")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk gone"):
        with atomic.building_directory(out) as work:
            (work / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "old.txt").read_text() == "old"


def test_writing_onto_a_folder_or_under_a_file_is_a_one_line_error(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(SettingsError, match=r"folder is a folder, not a file: give a file path, e\.g\. .*folder/NAME"):
        atomic.write_text(folder, "x")
    plain = tmp_path / "plain"
    plain.write_text("keep me")
    for below in (plain / "out.json", plain / "sub" / "out.json"):
        with pytest.raises(SettingsError, match=rf"{plain} is a file, not a folder, so {below} cannot be written: "
                                                rf"choose another path or move {plain}"):
            atomic.write_json(below, {})
    with pytest.raises(SettingsError, match=rf"{plain} is a file, not a folder: choose another path"):
        with atomic.building_directory(plain):
            pass
    assert plain.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "plain"]


@pytest.mark.parametrize("umask,file_mode,folder_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_outputs_get_the_mode_the_umask_gives_any_file(tmp_path, umask, file_mode, folder_mode):
    """As open() and mkdir() would make them, so that other users of a shared machine may read them."""
    previous = os.umask(umask)
    try:
        atomic.write_text(tmp_path / "report.md", "x")
        with atomic.building_directory(tmp_path / "set") as work:
            atomic.write_json(work / "meta.json", {})
    finally:
        os.umask(previous)
    for path, mode in ((tmp_path / "report.md", file_mode), (tmp_path / "set", folder_mode),
                       (tmp_path / "set" / "meta.json", file_mode)):
        assert oct(path.stat().st_mode & 0o777) == oct(mode), path
