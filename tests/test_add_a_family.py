"""A student family added from one file (docs/extending.md, "Add a student family"): the toy ``nat_copy`` family
below, written into a copy of the project as ``fairseq_plugins/models/nat_copy.py`` with one import line, is a
student that next_steps prints, fairseq-train trains with its architecture's defaults and fairseq-generate
decodes, without a change to any other file."""
import ast
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

FAMILY_FILE = '''"""Vanilla NAT whose decoder reads the source embeddings copied uniformly to the target length (Gu et al.,
2018), fairseq's --src-embedding-copy: the students kd_nat_copy_{tiny,small,base,big}."""
from fairseq.models.nat.nonautoregressive_transformer import base_architecture as nat_base_architecture

from .nat import StudentFamily, register_student_family


def nat_copy_base_architecture(args):
    args.src_embedding_copy = getattr(args, "src_embedding_copy", True)
    nat_base_architecture(args)


register_student_family("nat_copy", StudentFamily(
    "nonautoregressive_transformer", nat_copy_base_architecture,
    ("--noise", "full_mask", "--pred-length-offset", "--length-loss-factor", "0.1"),
    ("--iter-decode-max-iter", "0"),
))
'''
ENTRY = "from .models import nat, nat_copy, transformer  # noqa: F401"


def test_the_docs_worked_example_is_this_family():
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    assert FAMILY_FILE in text and ENTRY in text


def test_a_taken_family_name_is_refused():
    from fairseq_plugins.models.nat import STUDENT_FAMILIES, register_student_family

    before = dict(STUDENT_FAMILIES)
    with pytest.raises(ValueError, match="'glat' is registered already"):
        register_student_family("glat", STUDENT_FAMILIES["nat"])
    assert STUDENT_FAMILIES == before


def with_family_imported(init: str, module: str) -> str:
    """The plugin package's ``__init__.py`` with ``module`` added to its import of the models, however that import
    reads (the families it names, on one line or several)."""
    found = [node for node in ast.parse(init).body
             if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == "models"]
    assert len(found) == 1, "fairseq_plugins/__init__.py imports its models in one statement"
    lines = init.splitlines(keepends=True)
    names = sorted({alias.name for alias in found[0].names} | {module})
    start, end = found[0].lineno - 1, found[0].end_lineno
    lines[start:end] = [f"from .models import {', '.join(names)}  # noqa: F401\n"]
    return "".join(lines)


def test_the_family_joins_the_plugins_import_however_it_reads():
    assert with_family_imported("from . import a\nfrom .models import nat, transformer  # noqa: F401\nx = 1\n",
                                "nat_copy") == ("from . import a\n" + ENTRY + "\nx = 1\n")
    assert with_family_imported("from .models import (\n    zeta,\n    nat,\n)\n", "nat_copy") == (
        "from .models import nat, nat_copy, zeta  # noqa: F401\n")


@pytest.fixture(scope="module")
def project_with_family(tmp_path_factory):
    """A copy of the project's code with the toy family: its file, and its name added to the plugin's imports."""
    copy = tmp_path_factory.mktemp("project")
    for package in ("nat_kd", "fairseq_plugins"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "fairseq_plugins" / "models" / "nat_copy.py").write_text(FAMILY_FILE, encoding="utf-8")
    init = copy / "fairseq_plugins" / "__init__.py"
    init.write_text(with_family_imported(init.read_text(encoding="utf-8"), "nat_copy"), encoding="utf-8")
    return copy


def run(copy, *argv, cwd):
    env = dict(os.environ, PYTHONPATH=str(copy))
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_a_family_from_one_file_trains_and_decodes_through_the_toolkit(project_with_family, tiny_en_de, tmp_path):
    copy = project_with_family
    listed = run(copy, sys.executable, "-c", "import nat_kd; from nat_kd.engine.steps import student_family; "
                 "print(nat_kd.__file__, student_family('kd_nat_copy_tiny'))", cwd=tmp_path)
    assert listed.split()[-2:] == [str(copy / "nat_kd" / "__init__.py"), "nat_copy"]

    distilled = tmp_path / "beam5"  # a distilled set's bin/ has the prepared corpus's layout
    shutil.copytree(tiny_en_de / "bin", distilled / "bin")
    printed = run(copy, sys.executable, "-m", "nat_kd.next_steps", "--prepared", str(tiny_en_de), "--distilled",
                  str(distilled), "--out", str(tmp_path / "students"), "--arch", "kd_nat_copy_tiny",
                  "--updates", "2", cwd=tmp_path).splitlines()
    train, generate = [shlex.split(line) for line in printed if line.startswith("fairseq-")][:2]
    assert train[train.index("--arch") + 1] == "kd_nat_copy_tiny"
    assert train[train.index("--user-dir") + 1] == str(copy / "fairseq_plugins")
    out = run(copy, sys.executable, "-m", "fairseq_cli.train", *train[1:], "--disable-validation", cwd=tmp_path)
    assert "done training" in out

    save_dir = tmp_path / "students" / "nat_copy.beam5"
    check = ("import sys, torch, fairseq_plugins; from fairseq import checkpoint_utils; "
             "m = checkpoint_utils.load_checkpoint_to_cpu(sys.argv[1])['cfg']['model']; "
             "print(m.arch, m.src_embedding_copy, m.noise)")
    assert run(copy, sys.executable, "-c", check, str(save_dir / "checkpoint_last.pt"), cwd=tmp_path
               ).split()[-3:] == ["kd_nat_copy_tiny", "True", "full_mask"]
    # decoded as printed, from the last checkpoint (no validation ran, so there is no best one)
    generate[generate.index("--path") + 1] = str(save_dir / "checkpoint_last.pt")
    decoded = run(copy, sys.executable, "-m", "fairseq_cli.generate", *generate[1:], cwd=tmp_path)
    assert sum(line.startswith("H-") for line in decoded.splitlines()) > 0
