"""nat_kd.references: distilled sets of the same sources as one set of several references a line (read back by
the fairseq task a reference at a time), or as their union; and refused where they are not of the same
sources."""
import json
import shlex

import pytest
import sacrebleu

import fairseq_plugins  # noqa: F401  (registers kd_translation_lev and the students)
from conftest import VALID_LINES, python_m, write_distilled
from nat_kd.artifacts import DistilledSet
from nat_kd.corpus import CorpusError
from nat_kd.distill.references import build, main, reference_file

TEACHERS = {"t1": None,  # the hand-made default: every third line said twice, the others their first three words
            "t2": lambda refs: [r.lower() for r in refs],
            "t3": lambda refs: [" ".join(r.split()[:4]) for r in refs]}


@pytest.fixture(scope="module")
def sets(tiny_en_de, tmp_path_factory):
    """Three hand-made distilled sets of Multi30k's valid sources, the fourth line left out of bin/."""
    folder = tmp_path_factory.mktemp("sets")
    targets = {}
    for name, make in TEACHERS.items():
        _, targets[name] = write_distilled(tiny_en_de, folder / name, bin_left_out=[4], targets=make, name=name)
    return [folder / name for name in TEACHERS], targets


def _binarized(folder, prefix):
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(folder / "bin" / "dict.de.txt"))
    dataset = data_utils.load_indexed_dataset(str(folder / "bin" / prefix), dictionary)
    return [dictionary.string(dataset[i]) for i in range(len(dataset))]


@pytest.mark.slow
def test_a_multi_reference_set_is_the_first_set_with_the_others_beside_it(sets, tmp_path, capsys):
    folders, targets = sets
    out = tmp_path / "three"
    assert main(["--sets", *map(str, folders), "--out", str(out)]) == 0
    assert "3 references a line" in capsys.readouterr().out
    first = DistilledSet(folders[0])
    for name in ("valid.en", "valid.de", "spm/valid.de", "bin/valid.en-de.en.bin", "bin/valid.en-de.de.bin",
                 "scores.tsv", "CARD.md"):
        assert (out / name).read_bytes() == (first.root / name).read_bytes(), name
    kept = [i for i in range(VALID_LINES) if i != 3]
    for k, folder in enumerate(folders[1:], start=2):
        assert reference_file(out, "valid", "de", k).read_text(encoding="utf-8").splitlines() == targets[f"t{k}"]
        pieces = (folder / "spm" / "valid.de").read_text(encoding="utf-8").splitlines()
        assert (out / "spm" / f"valid.ref{k}.de").read_text(encoding="utf-8").splitlines() == pieces
        assert _binarized(out, f"valid.ref{k}.en-de.de") == _binarized(folder, "valid.en-de.de")
        assert len(_binarized(out, f"valid.ref{k}.en-de.de")) == len(kept)  # line 4 left out, as in each set
    meta = json.loads((out / "meta.json").read_text())
    record = meta["references"]
    assert record["count"] == 3 and [s["name"] for s in record["sets"]] == ["t1", "t2", "t3"]
    # diversity: each reference scored against each other one by sacrebleu itself
    expected = [[None if i == j else round(sacrebleu.corpus_bleu(targets[a], [targets[b]]).score, 2)
                 for j, b in enumerate(TEACHERS)] for i, a in enumerate(TEACHERS)]
    assert record["pairwise_bleu"] == expected
    assert record["mean_pairwise_bleu"] == round(sum(v for row in expected for v in row if v is not None) / 6, 2)


def test_the_task_reads_every_reference_of_a_line_into_its_batch(sets, tiny_en_de, tmp_path):
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.options import get_training_parser, parse_args_and_arch

    folders, targets = sets
    out = tmp_path / "three"
    build(folders, out)
    args = parse_args_and_arch(get_training_parser(), [str(out / "bin"), "--task", "kd_translation_lev",
                                                       "--references", "3", "--noise", "full_mask", "--arch",
                                                       "kd_glat_ctc_tiny"])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("valid")
    dataset = task.datasets["valid"]
    batch = dataset.collater([dataset[i] for i in (0, 5, 9)])
    d = task.target_dictionary
    for b, i in enumerate(batch["id"].tolist()):
        line = i if i < 3 else i + 1  # bin/ lacks line 4
        for k in range(3):
            reference = batch["references"][b, k]
            words = d.string(reference[reference.ne(d.pad())][1:])  # without <s>
            pieces = (folders[k] / "spm" / "valid.de").read_text(encoding="utf-8").splitlines()[line]
            assert words == d.string(d.encode_line(pieces, add_if_not_exist=False))


@pytest.mark.slow
def test_the_union_set_holds_every_sets_pairs_one_after_the_other(sets, tiny_en_de, tmp_path):
    folders, targets = sets
    out = tmp_path / "union"
    meta = build(folders, out, union=True, reference=tiny_en_de / "raw" / "valid.de")
    sources = (tiny_en_de / "raw" / "valid.en").read_text(encoding="utf-8").splitlines()
    assert (out / "valid.en").read_text(encoding="utf-8").splitlines() == sources * 3
    assert (out / "valid.de").read_text(encoding="utf-8").splitlines() == [t for name in TEACHERS
                                                                            for t in targets[name]]
    assert meta["sentences"] == 3 * VALID_LINES and meta["files"]["binarized_left_out_lines"] == [4, 1018, 2032]
    assert _binarized(out, "valid.en-de.de") == [line for folder in folders
                                                 for line in _binarized(folder, "valid.en-de.de")]
    assert meta["union"]["mean_pairwise_bleu"] > 0 and (out / "CARD.md").is_file()
    # its scores pair each set's lines with the real targets, as the generator scores one set
    references = (tiny_en_de / "raw" / "valid.de").read_text(encoding="utf-8").splitlines()
    expected = sacrebleu.corpus_bleu([t for name in TEACHERS for t in targets[name]], [references * 3])
    assert meta["scores"]["bleu"] == round(expected.score, 4) and meta["scores"]["bleu_signature"]
    assert json.loads((out / "meta.json").read_text())["scores"] == meta["scores"]


@pytest.mark.slow
def test_the_analysis_holds_a_union_set_against_the_real_targets_once_for_each_set_in_it(sets, tiny_en_de, tmp_path):
    """The union of three sets of the valid sources pairs with the real targets three times over: its BLEU and
    length ratio against them are sacrebleu's with the real targets repeated, and its card is refreshed."""
    from nat_kd.analysis.report import AnalysisReport, DataSet, set_from_dir
    from nat_kd.analysis.tokenizers import get_tokenizer

    folders, targets = sets
    out = tmp_path / "union"
    build(folders, out, union=True, reference=tiny_en_de / "raw" / "valid.de")
    real = DataSet("real", tiny_en_de / "raw" / "valid.en", tiny_en_de / "raw" / "valid.de")
    union = set_from_dir(out, None, "en", "de")
    assert union.real_repeats == 3 and set_from_dir(folders[0], None, "en", "de").real_repeats == 1
    report = AnalysisReport(get_tokenizer("13a", lowercase=True), drop_empty=True).run(real, [union])
    row = {r["name"]: r for r in report.rows}[union.name]
    references = (tiny_en_de / "raw" / "valid.de").read_text(encoding="utf-8").splitlines()
    expected = sacrebleu.corpus_bleu([t for name in TEACHERS for t in targets[name]], [references * 3],
                                     lowercase=True)
    assert row["bleu"] == pytest.approx(expected.score, abs=1e-9) and row["sentences"] == 3 * VALID_LINES
    assert row["length_ratio"] == pytest.approx(expected.sys_len / expected.ref_len)
    assert report.refresh_cards(real, [union]) == [out]
    assert json.loads((out / "card.json").read_text())["analysis"]


def test_sets_of_other_sources_are_refused_naming_the_line(sets, tiny_en_de, tmp_path, capsys):
    folders, _ = sets
    other = tmp_path / "other"
    write_distilled(tiny_en_de, other, bin_left_out=[4])
    text = (other / "valid.en").read_text(encoding="utf-8").splitlines()
    text[6] = "a different source"
    (other / "valid.en").write_text("".join(line + "\n" for line in text), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"valid\.en differs from .*valid\.en at line 7: the sets must decode "
                                          "the same sources"):
        build([folders[0], other], tmp_path / "out")
    assert main(["--sets", str(folders[0]), "--out", str(tmp_path / "out")]) == 2
    assert "give two distilled sets or more" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_next_steps_prints_commands_that_train_a_student_on_every_reference(tiny_en_de, tmp_path, capsys):
    """A multi-reference set of the training split: next_steps prints fairseq-train with the loss that takes
    several references, which trains a CTC student with glancing for a few updates, and fairseq-generate, which
    tests it; a student that takes one reference a sentence is refused in one line."""
    from conftest import MICRO_MODEL

    from nat_kd import next_steps

    folders = []
    for name, make in TEACHERS.items():
        write_distilled(tiny_en_de, tmp_path / name, targets=make, name=name, split="train")
        folders.append(tmp_path / name)
    build(folders, tmp_path / "three")
    assert next_steps.main(["--prepared", str(tiny_en_de), "--distilled", str(tmp_path / "three"), "--out",
                            str(tmp_path / "students"), "--arch", "kd_glat_ctc_tiny", "--updates", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    train, generate = shlex.split(printed[1]), shlex.split(printed[2])
    assert train[train.index("--references") + 1] == "3" and train[train.index("--criterion") + 1] == \
        "multi_reference_nat_loss" and train[train.index("--reference-selection") + 1] == "ddrs"
    # DDRS's schedule over the run's 3 updates: t = update / (3 - 4 x round(3 x 5000 / 300000))
    assert (train[train.index("--ddrs-max-update") + 1], train[train.index("--ddrs-save-interval-updates") + 1]) == \
        ("3", "0")
    assert "--references" not in printed[3]  # the twin on the real data: one reference a sentence
    sizes = dict(zip(MICRO_MODEL[::2], MICRO_MODEL[1::2]))
    train = [sizes.get(train[i - 1], word) if i else word for i, word in enumerate(train)]
    for command in (train, generate):
        done = python_m(f"fairseq_cli.{command[0].split('-')[1]}", *command[1:])
    assert (tmp_path / "students" / "glat_ctc.three" / "checkpoint_best.pt").is_file()
    assert "S-" in done and "D-" in done  # the test split translated
    assert next_steps.main(["--prepared", str(tiny_en_de), "--distilled", str(tmp_path / "three"), "--out",
                            str(tmp_path / "students"), "--arch", "kd_nat_tiny"]) == 2
    err = capsys.readouterr().err
    assert "--arch kd_nat_tiny: its loss takes one reference a sentence" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_generator_decodes_with_each_teacher_separately_into_one_multi_reference_set(teacher, tiny_en_de, corpus,
                                                                                          tmp_path):
    """--separately: each teacher's own set, as a run with that teacher alone writes it; then the first set with
    the second's targets beside it. The same checkpoint twice is two identical references."""
    from conftest import config, lines, output_bytes
    from nat_kd.distill import distill
    from nat_kd.generate_distilled import main as generate

    out = tmp_path / "two"
    assert generate(["--teacher-path", f"{teacher}:{teacher}", "--separately", "--source", str(corpus / "src.en"),
                     "--reference", str(corpus / "ref.de"), "--split", "valid", "--spm-model",
                     str(tiny_en_de / "spm.model"), "--teacher-data", str(tiny_en_de / "bin"), "--strategy", "greedy",
                     "--max-len-b", "20", "--workers", "1", "--threads", "1", "--no-progress-bar", "--out",
                     str(out)]) == 0
    alone = distill(config(teacher, tiny_en_de, corpus, tmp_path / "alone", strategy="greedy")).out_dir
    for k in (1, 2):
        part = output_bytes(tmp_path / "two.teachers" / str(k))
        assert part == output_bytes(alone)
    assert lines(out / "valid.ref2.de") == lines(out / "valid.de") == lines(alone / "valid.de")
    assert json.loads((out / "meta.json").read_text())["references"]["pairwise_bleu"] == [[None, 100.0], [100.0, None]]
