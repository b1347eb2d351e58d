"""The command lines' shared error handling, and the one spelling of teacher options (old one deprecated)."""
import functools

import pytest

from nat_kd import cli
from nat_kd.corpus import CorpusError
from nat_kd.errors import NatKdError


def test_toolkit_errors_are_one_line_and_exit_status_2(capsys):
    def bad_input():
        raise CorpusError("data.en:3: invalid UTF-8; re-encode the file")

    assert cli.run(bad_input) == 2
    assert capsys.readouterr().err == "error: data.en:3: invalid UTF-8; re-encode the file\n"
    assert issubclass(CorpusError, NatKdError)


def test_plugin_teacher_errors_count_as_toolkit_errors(capsys):
    from fairseq_plugins.criterions.topk import TopKError
    from fairseq_plugins.teacher import TeacherError

    for error in (TeacherError, TopKError):
        def body():
            raise error("teacher t.pt: pass --teacher-data")

        assert cli.run(body) == 2 and "pass --teacher-data" in capsys.readouterr().err


def test_other_errors_are_bugs_and_keep_their_traceback():
    def bug():
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        cli.run(bug)
    assert cli.run(lambda: None) == 0 and cli.run(lambda: 3) == 3


def test_generator_teacher_options_new_and_deprecated_spelling(capsys):
    from nat_kd.distill.__main__ import build_parser, config_from_args

    common = ["--source", "s.en", "--spm-model", "spm.model", "--out", "o"]
    new = config_from_args(build_parser().parse_args(
        ["--teacher-path", "a.pt:b.pt", "--teacher-data", "dicts", *common]))
    assert capsys.readouterr().err == ""
    old = config_from_args(build_parser().parse_args(["--teacher", "a.pt", "b.pt", "--dict-dir", "dicts", *common]))
    err = capsys.readouterr().err
    assert "--teacher is deprecated; use --teacher-path" in err and "--dict-dir is deprecated; use --teacher-data" in err
    assert new == old and new.teachers == ["a.pt", "b.pt"] and new.dict_dir == "dicts"
    with pytest.raises(SystemExit):  # one spelling at a time
        build_parser().parse_args(["--teacher-path", "a.pt", "--teacher", "b.pt", *common])
    with pytest.raises(SystemExit):  # a teacher is required
        build_parser().parse_args(common)


# A command run as ``python -m`` runs it (runpy), then fairseq's loggers are probed in the same process.
PROBE = """
import logging, runpy, sys
module, args = sys.argv[1], sys.argv[2:]
sys.argv = [module, *args]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
import fairseq.tasks.text_to_speech  # already imported by the command, or imported now
logging.getLogger("fairseq.tasks.translation").info("probe: fairseq info")
logging.getLogger("fairseq_cli.train").warning("probe: fairseq warning")
logging.getLogger("nat_kd.generate_distilled").info("probe: toolkit info")
logging.getLogger("nat_kd.generate_distilled").warning("probe: toolkit warning")
logging.getLogger("nat_kd.study").error("probe: toolkit error")
"""
COMMANDS = ["nat_kd.generate_distilled", "nat_kd.distill", "nat_kd.analyze", "nat_kd.prepare", "nat_kd.study",
            "nat_kd.teacher_topk", "nat_kd.mix"]


@functools.cache  # a fresh interpreter each (fairseq's import is what is probed), once per command line
def run_probe(module: str, *args: str) -> str:
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


@pytest.mark.parametrize("module", COMMANDS)
@pytest.mark.slow
def test_fairseq_logs_only_warnings_unless_verbose(module):
    """--help included: fairseq's INFO lines (the tensorboardX hint it logs as it is imported among them) are
    not shown; its warnings and the toolkit's own INFO lines are."""
    out = run_probe(module, "--help")
    assert "usage:" in out and "--verbose" in out
    assert "tensorboardX" not in out and "probe: fairseq info" not in out
    assert "probe: fairseq warning" in out and "probe: toolkit info" in out


@pytest.mark.parametrize("module", ["nat_kd.generate_distilled", "nat_kd.teacher_topk"])
@pytest.mark.slow
def test_verbose_shows_fairseqs_info(module):
    out = run_probe(module, "--verbose", "--help")
    assert "Please install tensorboardX" in out and "probe: fairseq info" in out and "probe: toolkit info" in out


@pytest.mark.parametrize("module, logged", [
    ("nat_kd.generate_distilled", {"nat_kd.generate_distilled | probe: toolkit info",
                                   "nat_kd.generate_distilled | WARNING: probe: toolkit warning",
                                   "nat_kd.study | ERROR: probe: toolkit error",
                                   "fairseq_cli.train | WARNING: probe: fairseq warning"}),
    ("nat_kd.study", {"probe: toolkit info", "WARNING: probe: toolkit warning", "ERROR: probe: toolkit error",
                      "WARNING: probe: fairseq warning"})])  # the study's format has no logger name
@pytest.mark.slow
def test_warnings_and_errors_show_their_level(module, logged):
    """A warning does not read like one more info line: from WARNING up, the message starts with its level."""
    out = run_probe(module, "--help")
    assert {line.split(" | ", 1)[1] for line in out.splitlines() if "probe: " in line} == logged
