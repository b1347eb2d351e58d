"""The README's quickstart, as written: its block is read from README.md and run on a tiny corpus, with only sizes
(vocabulary, model, updates) and paths made tiny, so that a broken line of the README fails here."""
import json
import re
import shlex

import pytest
from conftest import ROOT, lines, marian_teacher, python_m

MICRO_TEACHER = ("--arch kd_transformer_tiny --encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 "
                 "--decoder-embed-dim 32 --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 "
                 "--encoder-attention-heads 2 --decoder-attention-heads 2 --max-update 40")
# (the README's text, the tiny run's): sizes and paths only
SUBSTITUTIONS = [
    ("--out-dir data/en-ro", "--out-dir data/en-ro --vocab-size 300"),
    ("--arch kd_transformer_base", MICRO_TEACHER),
    ("--warmup-updates 4000", "--warmup-updates 10"),
    ("--user-dir fairseq_plugins", f"--user-dir {ROOT / 'fairseq_plugins'}"),
    ("--updates 500", "--updates 3"),
]
TOOLS = {"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate"}


def quickstart(block: int = 0) -> list[str]:
    """The quickstart's ``block``-th bash block (0: the main one, 1: with a published teacher), one command a
    line, its comments and `source` left out."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quickstart on your own data\n", 1)[1].split("\n## ", 1)[0]
    lines = re.findall(r"```bash\n(.*?)\n```", section, re.S)[block].replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip() and not line.lstrip().startswith(("#", "source "))]


def run(command: str, cwd) -> str:
    """A quickstart line (``python -m X ...``, ``fairseq-train ...``, ``fairseq-generate ...``) run in ``cwd``."""
    argv = shlex.split(command)
    module, args = (argv[2], argv[3:]) if argv[:2] == ["python", "-m"] else (TOOLS[argv[0]], argv[1:])
    return python_m(module, *args, cwd=cwd)


def test_the_quickstart_block_is_found_and_every_substitution_applies():
    commands = quickstart()
    assert [shlex.split(c)[:3] for c in commands] == [
        ["python", "-m", "nat_kd.prepare"], ["fairseq-train", "data/en-ro/bin", "--user-dir"],
        ["python", "-m", "nat_kd.generate_distilled"], ["python", "-m", "nat_kd.generate_distilled"],
        ["python", "-m", "nat_kd.analyze"], ["python", "-m", "nat_kd.choose"], ["python", "-m", "nat_kd.next_steps"]]
    text = "\n".join(commands)
    for old, _ in SUBSTITUTIONS:
        assert old in text, f"the README no longer says {old!r}: update the substitutions"


def run_block(commands: list[str], cwd) -> str:
    """Each command with the substitutions, in ``cwd``; the last one's output."""
    for command in commands:
        for old, new in SUBSTITUTIONS:
            command = command.replace(old, new)
        out = run(command, cwd)
    return out


@pytest.fixture(scope="module")
def quickstarted(tiny_en_de, tmp_path_factory):
    """The main block run in a folder of raw text: (the folder, step 6's output). A German side named ro stands
    for any target language: the commands name en-ro."""
    folder = tmp_path_factory.mktemp("quickstart")
    (folder / "raw").mkdir()
    for split, ours, count in (("train", "train", None), ("dev", "valid", 60), ("test", "test", 60)):
        for lang, theirs in (("en", "en"), ("de", "ro")):
            text = (tiny_en_de / "raw" / f"{ours}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
            (folder / "raw" / f"{split}.{theirs}").write_text("".join(text[:count]), encoding="utf-8")
    return folder, run_block(quickstart(), folder)


@pytest.mark.slow
def test_the_quickstart_runs_as_written_from_raw_text_to_a_tested_student(quickstarted):
    tmp_path, out = quickstarted
    ranking = (tmp_path / "runs" / "choose" / "ranking.md").read_text(encoding="utf-8").splitlines()
    assert ranking[0] == "# Which training set for kd_glat_tiny at 2x128? Pilots of 3 updates"
    # pilots of a few updates have not learned yet: told to pilot as long as glat's committed pilots first agreed
    assert ranking[2].startswith("Verdict: pilot longer: these pilots have not learned yet.")
    assert ranking[2].endswith("Pilot at least 250 updates, where glat pilots at 2x128 first picked the final best in "
                               "every committed study.")
    # step 6 printed the student's commands: train it for a few updates and test it, as printed
    printed = [line for line in out.splitlines() if line.startswith(("fairseq-train ", "fairseq-generate "))]
    assert [line.split()[0] for line in printed] in (["fairseq-train", "fairseq-generate"] * 2,
                                                     ["fairseq-train", "fairseq-generate"])
    assert "--arch kd_glat_tiny" in printed[0] and "--encoder-embed-dim 128" in printed[0]
    run(printed[0] + " --max-update 3", tmp_path)
    scored = run(printed[1], tmp_path)
    assert re.search(r"Generate test with beam=1: BLEU = [\d.]+", scored), scored[-2000:]


@pytest.mark.slow
def test_the_quickstart_with_a_published_teacher_reaches_choose(quickstarted):
    """The second block, with a tiny MarianMT folder (an OPUS-MT model's layout, test_generate_published) standing
    for the downloaded one: its set comes in the student's tokens, and choose ranks it beside the main one's."""

    folder, _ = quickstarted
    marian_teacher(lines(folder / "raw" / "train.en"), lines(folder / "raw" / "train.ro"), folder,
                   folder / "opus-mt-en-ro")
    commands = quickstart(1)
    assert [shlex.split(c)[:3] for c in commands] == [["python", "-m", "nat_kd.generate_distilled"],
                                                      ["python", "-m", "nat_kd.choose"]]
    # a random teacher writes long outputs: the length is a size
    commands[0] += " --max-len-b 12"
    run_block(commands, folder)
    meta = json.loads((folder / "runs" / "distill" / "opus-beam5" / "meta.json").read_text(encoding="utf-8"))
    assert meta["teacher"]["name"] == "opus-mt-en-ro" and "student_vocabulary" in meta
    ranked = json.loads((folder / "runs" / "choose-opus" / "ranking.json").read_text(encoding="utf-8"))
    assert sorted(r["set"] for r in ranked["rows"]) == ["beam5", "opus-beam5", "real"]


@pytest.mark.parametrize("broken", ["--strategy beem", "--set-dir runs/distill/beam6"])
@pytest.mark.slow
def test_a_broken_quickstart_line_fails_the_run(broken, tmp_path, monkeypatch):
    """What the test above would meet if the README said this: the command fails, so the test would."""
    command = {"--strategy beem": "python -m nat_kd.generate_distilled --strategy beem --out x",
               "--set-dir runs/distill/beam6": "python -m nat_kd.analyze report --real-src a --real-tgt b "
                                               "--set-dir runs/distill/beam6 --out x"}[broken]
    with pytest.raises(AssertionError):
        run(command, tmp_path)
