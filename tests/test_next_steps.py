"""The main job's closing lines: the fairseq-train and fairseq-generate commands of a NAT student on the distilled
set and on the real data (nat_kd.next_steps), which must run as printed; any student, or nat_kd.choose's pick."""
import json
import shlex
import shutil

import pytest

from conftest import ROOT, python_m

from nat_kd import next_steps


def test_main_job_ends_with_the_student_commands():
    last = (ROOT / "scripts" / "main.sh").read_text(encoding="utf-8").rstrip().splitlines()[-1]
    assert last.startswith("python -m nat_kd.next_steps ")
    assert '--prepared "$DATA" --distilled "$RUN_DIR/distill/beam5"' in last


@pytest.mark.slow
def test_printed_commands_train_a_student(tiny_en_de, tmp_path, capsys):
    distilled = tmp_path / "beam5"  # a distilled set's bin/ has the prepared corpus's layout
    shutil.copytree(tiny_en_de / "bin", distilled / "bin")
    assert next_steps.main(["--prepared", str(tiny_en_de), "--distilled", str(distilled),
                            "--out", str(tmp_path / "students")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed[1:]] == ["fairseq-train", "fairseq-generate"] * 2
    for command, data, save_dir in zip(printed[1::2], [distilled, tiny_en_de], ["nat.beam5", "nat.real"]):
        argv = shlex.split(command)
        assert argv[:2] == ["fairseq-train", str((data / "bin").resolve())]
        assert argv[argv.index("--arch") + 1] == "kd_nat_tiny"
        assert argv[argv.index("--save-dir") + 1] == str((tmp_path / "students" / save_dir).resolve())
        # as pasted, with a budget of 2 updates (fairseq takes the last --max-update)
        out = python_m("fairseq_cli.train", *argv[1:], "--max-update", "2", "--disable-validation", cwd=tmp_path)
        assert "done training" in out, out[-3000:]
        assert (tmp_path / "students" / save_dir / "checkpoint_last.pt").is_file()


def test_a_missing_folder_is_an_error(tiny_en_de, tmp_path, capsys):
    assert next_steps.main(["--prepared", str(tiny_en_de), "--distilled", str(tmp_path / "none"),
                            "--out", str(tmp_path / "students")]) == 2
    assert "none/bin: no such folder" in capsys.readouterr().err
    # a fairseq-binarized corpus: one line that says how to make a folder next_steps takes
    assert next_steps.main(["--prepared", str(tiny_en_de / "bin"), "--distilled", str(tmp_path / "none"),
                            "--out", str(tmp_path / "students")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "has no manifest.json naming its languages" in err
    assert "make one from the corpus's raw text in its own tokens: python -m nat_kd.prepare --src SRC" in err


def ranking_file(path, corpus, sets: dict, order: list[str], arch="kd_glat_tiny"):
    """A ranking.json as nat_kd.choose writes it, with the keys next_steps reads."""
    path.write_text(json.dumps({"family": arch.split("_")[1], "updates": 250, "arch": arch, "shape": "arch",
                                "corpus": str(corpus), "sets": {k: str(v) for k, v in sets.items()},
                                "rows": [{"set": name, "valid_bleu": 10.0 - i} for i, name in enumerate(order)]}))
    return path


@pytest.mark.slow
def test_from_ranking_trains_chooses_pick_with_its_student_at_its_own_size(tiny_en_de, tmp_path, capsys):
    distilled = tmp_path / "beam5"
    shutil.copytree(tiny_en_de / "bin", distilled / "bin")
    ranking = ranking_file(tmp_path / "ranking.json", tiny_en_de, {"beam5": distilled}, ["beam5", "real"])
    assert next_steps.main(["--from-ranking", str(ranking), "--out", str(tmp_path / "students"),
                            "--updates", "300"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("# kd_glat_tiny (its own sizes) on beam5, and its twin on the real data")
    train = shlex.split(printed[1])
    assert train[1] == str((distilled / "bin").resolve()) and "--encoder-layers" not in train  # the pilot's sizes
    flag = {name: train[train.index(name) + 1] for name in ("--task", "--arch", "--max-update",
                                                            "--glance-anneal-updates", "--save-dir")}
    # glancing over the first two thirds of the 300 updates, as the recipe anneals over 1,333 of 2,000
    assert flag == {"--task": "kd_translation_lev", "--arch": "kd_glat_tiny", "--max-update": "300",
                    "--glance-anneal-updates": "200", "--save-dir": str((tmp_path / "students" / "glat.beam5").resolve())}
    out = python_m("fairseq_cli.train", *train[1:], "--max-update", "3", "--disable-validation", cwd=tmp_path)
    assert "done training" in out, out[-3000:]
    assert "num_updates 3" in out or "num_updates=3" in out, out[-2000:]


def test_from_ranking_with_the_real_data_first_trains_on_it_alone(tiny_en_de, tmp_path, capsys):
    ranking = ranking_file(tmp_path / "ranking.json", tiny_en_de, {"beam5": tmp_path / "beam5"}, ["real", "beam5"],
                           arch="kd_dat_tiny")
    assert next_steps.main(["--from-ranking", str(ranking), "--out", str(tmp_path / "s")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "# nat_kd.choose ranked the real data first: kd_dat_tiny (its own sizes) on it"
    assert len(printed) == 3 and shlex.split(printed[1])[1] == str((tiny_en_de / "bin").resolve())
    assert shlex.split(printed[2])[shlex.split(printed[2]).index("--task") + 1] == "kd_translation_lev"


@pytest.mark.parametrize("argv, message", [
    (["--arch", "kd_glat_tiny"], "--from-ranking takes the corpus, set, student and shape from the ranking: drop --arch"),
    ([], "a ranking written by an older nat_kd.choose"),
])
def test_from_ranking_refuses_what_it_cannot_take(tiny_en_de, tmp_path, capsys, argv, message):
    ranking = tmp_path / "ranking.json"
    if argv:
        ranking_file(ranking, tiny_en_de, {}, ["real"])
    else:  # before choose recorded the corpus, the student and the sets
        ranking.write_text(json.dumps({"family": "nat", "updates": 250, "rows": [{"set": "real"}]}))
    assert next_steps.main(["--from-ranking", str(ranking), "--out", str(tmp_path / "s"), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("shape, message", [("2x", "--shape 2x: write LAYERSxWIDTH"),
                                            ("2x130", "a width that its 4 heads divide")])
def test_a_wrong_shape_is_refused_with_the_form_to_write(tiny_en_de, tmp_path, capsys, shape, message):
    assert next_steps.main(["--prepared", str(tiny_en_de), "--distilled", str(tiny_en_de), "--out", str(tmp_path),
                            "--shape", shape]) == 2
    assert message in capsys.readouterr().err
