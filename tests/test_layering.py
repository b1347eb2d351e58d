"""Dependencies go one way: nat_kd uses fairseq_plugins, and the plugin works without nat_kd installed."""
import subprocess
import sys

from conftest import ROOT

# Every module of the plugin imported with nat_kd made unimportable; then what fairseq's --user-dir loads.
WITHOUT_NAT_KD = """
import importlib, pkgutil, sys

class BlockNatKd:
    def find_spec(self, name, path=None, target=None):
        if name == "nat_kd" or name.startswith("nat_kd."):
            raise ImportError("nat_kd is blocked in this test: " + name)
        return None

sys.meta_path.insert(0, BlockNatKd())
from argparse import Namespace
from fairseq import utils
utils.import_user_module(Namespace(user_dir="fairseq_plugins"))  # as fairseq-train --user-dir does
import fairseq_plugins
modules = [m.name for m in pkgutil.walk_packages(fairseq_plugins.__path__, "fairseq_plugins.")]
for name in modules:
    importlib.import_module(name)
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
assert {"word_kd", "nat_word_kd"} <= set(CRITERION_REGISTRY), sorted(CRITERION_REGISTRY)
assert {"kd_transformer_tiny", "kd_cmlm_tiny"} <= set(ARCH_MODEL_REGISTRY)
assert not [m for m in sys.modules if m == "nat_kd" or m.startswith("nat_kd.")]
print(len(modules), "modules")
"""


def test_fairseq_plugins_import_without_nat_kd():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_NAT_KD], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "criterions.word_kd" not in proc.stdout  # no import error named a module
    count = int(proc.stdout.strip().splitlines()[-1].split()[0])
    assert count >= 10  # the walk saw the whole plugin: criterions, models, teacher, counting, ...


def test_the_blocker_blocks():
    """The same blocker makes a nat_kd import fail, so the test above would see one."""
    code = WITHOUT_NAT_KD.split("from argparse")[0] + "import nat_kd.corpus\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    assert proc.returncode != 0 and "nat_kd is blocked" in proc.stdout
