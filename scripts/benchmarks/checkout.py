"""An earlier commit's tree, unpacked beside this checkout, for the scripts that compare the two."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def unpack(commit: str, folder: Path) -> Path:
    """``commit``'s files (git archive) in ``folder``, created; returns it."""
    folder.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder
