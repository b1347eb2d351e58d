"""The main job's closing lines: the fairseq-train commands of a NAT student on the distilled set and on the real
data (nat_kd.next_steps), which must run as printed."""
import shlex
import shutil
import subprocess
import sys

from conftest import ROOT

from nat_kd import next_steps


def test_main_job_ends_with_the_student_commands():
    last = (ROOT / "scripts" / "main.sh").read_text(encoding="utf-8").rstrip().splitlines()[-1]
    assert last.startswith("python -m nat_kd.next_steps ")
    assert '--prepared "$DATA" --distilled "$RUN_DIR/distill/beam5"' in last


def test_printed_commands_train_a_student(tiny_en_de, tmp_path, capsys):
    distilled = tmp_path / "beam5"  # a distilled set's bin/ has the prepared corpus's layout
    shutil.copytree(tiny_en_de / "bin", distilled / "bin")
    assert next_steps.main(["--prepared", str(tiny_en_de), "--distilled", str(distilled),
                            "--out", str(tmp_path / "students")]) == 0
    commands = capsys.readouterr().out.splitlines()[-2:]
    for command, data, save_dir in zip(commands, [distilled, tiny_en_de], ["nat.beam5", "nat.real"]):
        argv = shlex.split(command)
        assert argv[:2] == ["fairseq-train", str((data / "bin").resolve())]
        assert argv[argv.index("--arch") + 1] == "kd_nat_tiny"
        assert argv[argv.index("--save-dir") + 1] == str((tmp_path / "students" / save_dir).resolve())
        # as pasted, with a budget of 2 updates (fairseq takes the last --max-update)
        proc = subprocess.run([sys.executable, "-m", "fairseq_cli.train", *argv[1:], "--max-update", "2",
                               "--disable-validation"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        assert proc.returncode == 0 and "done training" in proc.stdout, proc.stdout[-3000:]
        assert (tmp_path / "students" / save_dir / "checkpoint_last.pt").is_file()


def test_a_missing_folder_is_an_error(tmp_path, capsys):
    assert next_steps.main(["--prepared", str(tmp_path), "--distilled", str(tmp_path / "none"),
                            "--out", str(tmp_path / "students")]) == 2
    assert "none/bin: no such folder" in capsys.readouterr().err
