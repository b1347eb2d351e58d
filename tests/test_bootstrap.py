"""scripts/bootstrap.sh refuses, in one line and before it makes anything, what cannot give a working venv."""
import os
import stat
import subprocess
import sys

import pytest
from conftest import ROOT


def fake_python(tmp_path, version: str, has_torch: bool):
    """A stand-in interpreter: answers the version check and `import torch` as a Python ``version`` would."""
    major, minor = (int(x) for x in version.split(".")[:2])
    script = tmp_path / "python"
    script.write_text(f"""#!/bin/sh
case "$*" in
  --version) echo "Python {version}" ;;
  *version_info*) exit {1 if (major, minor) < (3, 10) else 0} ;;
  *"import torch"*) {"echo 2.11.0+cu130" if has_torch else "exit 1"} ;;
  *) exit 3 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize("settings, line", [
    ({"NAT_KD_TORCH": "cuda"}, "[bootstrap] NAT_KD_TORCH=cuda: use 'pinned' (torch 2.13.0 from the package index) or "
                               "'system' (the torch {python} already has)"),
    ({"version": "3.9.18"}, "[bootstrap] nat-kd needs Python 3.10 or newer: {python} is Python 3.9.18; set "
                            "NAT_KD_PYTHON to another"),
    ({"NAT_KD_TORCH": "system", "torch": False}, "[bootstrap] NAT_KD_TORCH=system: {python} cannot import torch; set "
                                                 "NAT_KD_PYTHON to the Python that has it"),
    ({"NAT_KD_TORCH": "system", "NAT_KD_FAIRSEQ_WHEEL": "none.whl"},
     "[bootstrap] NAT_KD_FAIRSEQ_WHEEL=none.whl: no such file; unset it to build fairseq here"),
])
def test_what_cannot_work_is_refused_in_one_line_and_nothing_is_made(tmp_path, settings, line):
    python = fake_python(tmp_path, settings.pop("version", "3.12.3"), settings.pop("torch", True))
    venv = tmp_path / "venv"
    env = {**os.environ, "NAT_KD_PYTHON": str(python), "NAT_KD_VENV": str(venv), **settings}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [line.format(python=python)]
    assert not venv.exists()


def test_an_unchanged_venv_is_left_as_it_is(tmp_path):
    """The stamp holds the hash of the files and settings that define the venv: the same ones, nothing to do."""
    venv = tmp_path / "venv"
    env = {**os.environ, "NAT_KD_PYTHON": sys.executable, "NAT_KD_VENV": str(venv)}
    # the stamp bootstrap writes last, computed as it computes it, for these settings
    want = subprocess.run(["bash", "-c", f'cd "{ROOT}" && (cat scripts/bootstrap.sh scripts/constraints.txt setup.cfg '
                                         f'pyproject.toml; echo "pinned {sys.executable} ") | sha256sum | cut -c1-16'],
                          stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    venv.mkdir()
    (venv / ".nat-kd-stamp").write_text(want + "\n")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0 and proc.stderr == "" and sorted(p.name for p in venv.iterdir()) == [".nat-kd-stamp"]
