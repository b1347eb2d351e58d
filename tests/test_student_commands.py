"""docs/students.md's train and test commands, one pair for every family: nat_kd.next_steps prints exactly them,
and each pair, with only sizes and paths made tiny, trains a student for a few updates and tests it."""
import re
import shlex

import pytest
from conftest import ROOT, python_m, run_fairseq

from fairseq_plugins.models.nat import STUDENT_FAMILIES
from nat_kd import next_steps

DOC = ROOT / "docs" / "students.md"
BLOCK = re.compile(r"\(`kd_(\w+)_tiny`\):\n\n```bash\n(fairseq-train [^\n]*)\n(fairseq-generate [^\n]*)\n```")
# the documented paths, and the tiny ones the tests put in their place
PREPARED, DISTILLED, OUT = "data/multi30k.en-de.spm8000", "runs/multi30k.en-de/distill/beam5", "runs/students"
TRAIN_SENTENCES = 203  # conftest's tiny slice
MICRO = {"--encoder-embed-dim": "32", "--decoder-embed-dim": "32", "--encoder-ffn-embed-dim": "64",
         "--decoder-ffn-embed-dim": "64", "--encoder-layers": "1", "--decoder-layers": "1", "--max-update": "3"}


def documented() -> dict[str, tuple[str, str]]:
    return {family: (train, generate) for family, train, generate in BLOCK.findall(DOC.read_text(encoding="utf-8"))}


@pytest.fixture(scope="module")
def distilled(tiny_en_de, tmp_path_factory):
    """A distilled set's folder as next_steps reads it (its bin/ has the prepared corpus's layout), with the
    tiny corpus's training pairs, 20 validation pairs, so that validating takes seconds, and the training pairs
    again as the test split: 203 sentences, not a multiple of 8, every one of which must be translated."""
    folder = tmp_path_factory.mktemp("sets") / "beam5"
    for lang in ("en", "de"):
        lines = (tiny_en_de / "spm" / f"test.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:20]
        (folder.parent / f"small.{lang}").write_text("".join(lines), encoding="utf-8")
    train = tiny_en_de / "spm" / "train"
    run_fairseq("preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", train,
                "--validpref", folder.parent / "small", "--testpref", train, "--destdir",
                folder / "bin", "--srcdict", tiny_en_de / "bin" / "dict.en.txt", "--tgtdict",
                tiny_en_de / "bin" / "dict.de.txt", "--workers", "1")
    return folder


def as_documented(text: str, tiny_en_de, distilled, out) -> str:
    """next_steps' output with the test's folders written as the page writes them."""
    for path, placeholder in ((ROOT, None), (distilled.resolve(), DISTILLED), (tiny_en_de.resolve(), PREPARED),
                              (out.resolve(), OUT)):
        text = text.replace(f"{path}/", "") if placeholder is None else text.replace(str(path), placeholder)
    return text


@pytest.mark.slow
def test_the_page_shows_what_next_steps_prints_for_every_family(tiny_en_de, distilled, tmp_path, capsys):
    blocks = documented()
    assert sorted(blocks) == sorted(STUDENT_FAMILIES)
    for family in STUDENT_FAMILIES:
        assert next_steps.main(["--prepared", str(tiny_en_de), "--distilled", str(distilled), "--out",
                                str(tmp_path), "--arch", f"kd_{family}_tiny"]) == 0
        printed = as_documented(capsys.readouterr().out, tiny_en_de, distilled, tmp_path).splitlines()
        assert tuple(printed[1:3]) == blocks[family], family


@pytest.mark.parametrize("family", list(STUDENT_FAMILIES))
@pytest.mark.slow
def test_each_familys_commands_train_and_test_a_student(family, tiny_en_de, distilled, tmp_path):
    train, generate = (shlex.split(command.replace(DISTILLED, str(distilled)).replace(OUT, str(tmp_path)))
                       for command in documented()[family])
    for flag, value in MICRO.items():
        train[train.index(flag) + 1] = value
    assert python_m("fairseq_cli.train", *train[1:]).count("done training") == 1
    assert (tmp_path / f"{family}.beam5" / "checkpoint_best.pt").is_file()
    scored = python_m("fairseq_cli.generate", *generate[1:])
    assert re.search(r"Generate test with beam=1: BLEU = [\d.]+", scored), scored[-2000:]
    translated = sorted(int(n) for n in re.findall(r"^H-(\d+)\t", scored, re.M))
    assert translated == list(range(TRAIN_SENTENCES)), f"{len(translated)} of {TRAIN_SENTENCES} translated"
