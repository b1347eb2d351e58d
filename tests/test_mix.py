"""nat_kd.mix: the rule is applied line by line, and nothing is lost (texts, pieces, binarized data, counts)."""
import json

import numpy as np
import sacrebleu
import pytest

from nat_kd.analysis.metrics.sentence import SentenceScores
from nat_kd.artifacts import DistilledSet
from nat_kd.distill.source import load_binarized
from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file
from nat_kd.mix import MixRule, main, mix

from conftest import VALID_LINES as N, write_distilled


@pytest.fixture(scope="module")
def distilled(tiny_en_de, tmp_path_factory):
    out = tmp_path_factory.mktemp("sets") / "kd"
    return (out, *write_distilled(tiny_en_de, out))


def lines(path):
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def binarized_target(folder):
    """The binarized target side, and a function giving what a pieces line becomes there (the tiny
    dictionary maps pieces it lacks to <unk>)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(str(folder / "bin" / "dict.de.txt"))
    stored = [dictionary.string(t) for t in load_binarized(folder / "bin", "valid", "de", "en-de", dictionary)]
    return stored, lambda line: dictionary.string(dictionary.encode_line(line, add_if_not_exist=False))


@pytest.mark.slow
def test_repeated_lines_take_the_reference_line_by_line(distilled, tiny_en_de, tmp_path, capsys):
    kd, refs, targets = distilled
    out = tmp_path / "mixed"
    assert main(["--distilled", str(kd), "--prepared", str(tiny_en_de), "--repeated", "--out", str(out)]) == 0
    assert f"{len(range(0, N, 3))} of {N} lines take the real target (repeated)" in capsys.readouterr().out
    mixed = lines(out / "valid.de")
    assert len(mixed) == N
    for i, line in enumerate(mixed):
        assert line == (refs[i] if i % 3 == 0 else targets[i]), i
    # the pieces and the binarized targets follow the same rule: the prepared corpus's own pieces on real lines
    prepared_pieces = lines(tiny_en_de / "spm" / "valid.de")
    kd_pieces = lines(kd / "spm" / "valid.de")
    expected = [prepared_pieces[i] if i % 3 == 0 else kd_pieces[i] for i in range(N)]
    assert lines(out / "spm" / "valid.de") == expected
    stored, as_stored = binarized_target(out)
    assert stored == [as_stored(line) for line in expected]
    # the source side is the distilled set's, unchanged, text and binarized
    assert lines(out / "valid.en") == lines(kd / "valid.en")
    assert (out / "bin" / "valid.en-de.en.bin").read_bytes() == (kd / "bin" / "valid.en-de.en.bin").read_bytes()
    scores = SentenceScores.read(out / "scores.tsv")
    assert scores["replaced"].tolist() == [float(i % 3 == 0) for i in range(N)]
    assert np.isnan(scores["logprob"][0]) and scores["logprob"][1] == pytest.approx(-0.1)
    assert scores["bleu"][0] == 100.0
    meta = json.loads((out / "meta.json").read_text())
    replaced = len(range(0, N, 3))
    assert meta["mix"]["replaced"] == replaced and meta["mix"]["lines"] == N and meta["mix"]["rule"] == "repeated"
    assert meta["mix"]["replaced_by_rule"] == {"repeated": replaced} and meta["strategy"] == "beam+mix"
    card = json.loads((out / "card.json").read_text())
    assert card["mix"]["replaced"] == replaced and "Rule: `repeated`" in (out / "CARD.md").read_text()
    assert {p.name for p in DistilledSet(out).root.iterdir()} >= {"CARD.md", "card.json", "scores.tsv", "bin"}


@pytest.mark.slow
def test_lines_left_out_of_bin_stay_out(tiny_en_de, tmp_path):
    """The generator leaves empty sources' pairs out of bin/ (meta.json files.binarized_left_out_lines): the mix
    keeps every line in its text files and leaves the same lines out of its bin/, the other pairs aligned."""
    kd = tmp_path / "kd"
    write_distilled(tiny_en_de, kd, bin_left_out=[2, N])
    out = tmp_path / "mixed"
    meta = mix(kd, out, MixRule(repeated=True), prepared=str(tiny_en_de))
    assert meta["files"]["binarized_left_out_lines"] == [2, N] and meta["files"]["binarized_sentences"] == N - 2
    assert len(lines(out / "valid.de")) == N
    stored, as_stored = binarized_target(out)
    kept = [line for i, line in enumerate(lines(out / "spm" / "valid.de")) if i + 1 not in (2, N)]
    assert stored == [as_stored(line) for line in kept]
    assert (out / "bin" / "valid.en-de.en.bin").read_bytes() == (kd / "bin" / "valid.en-de.en.bin").read_bytes()


def test_thresholds_are_or_ed_and_worst_first_reaches_a_target(distilled, tiny_en_de, tmp_path):
    kd, refs, targets = distilled
    scores = SentenceScores.read(DistilledSet(kd).scores_file)
    rule = MixRule(bleu_below=30.0, logprob_below=-2.5)
    meta = mix(kd, tmp_path / "t", rule, prepared=str(tiny_en_de))
    expected = (scores["bleu"] < 30.0) | (scores["logprob"] < -2.5)
    assert meta["mix"]["replaced"] == int(expected.sum()) and 0 < expected.sum() < N
    assert lines(tmp_path / "t" / "valid.de") == [r if e else t for r, t, e in zip(refs, targets, expected)]
    # worst first: the order puts the threshold lines first, then the lowest BLEU
    order = MixRule(repeated=True, target_complexity=0.0).order(scores, scores["repeated"] > 0)
    first = len(range(0, N, 3))
    assert order[:first].tolist() == [i for i in range(N) if i % 3 == 0]
    rest = scores["bleu"][order[first:]]
    assert (np.diff(rest) >= 0).all()


@pytest.mark.slow
def test_the_complexity_search_replaces_the_fewest_worst_lines_that_reach_the_target(distilled, tiny_en_de,
                                                                                      tmp_path):
    """--target-complexity halfway between the set's C(d) and the real data's: the mix replaces k lines, worst
    sentence BLEU first; C(d) with those k lines replaced reaches the target, with k - 1 it does not (both
    measured here, line by line, without the search)."""
    from nat_kd.mix import complexity_of, mix_targets

    kd, refs, targets = distilled
    sources = (tiny_en_de / "raw" / "valid.en").read_text(encoding="utf-8").splitlines()
    names = ("valid.en", "valid.de")
    start, end = complexity_of(sources, targets, names), complexity_of(sources, refs, names)
    target = (start + end) / 2
    rule = MixRule(target_complexity=target)
    meta = mix(kd, tmp_path / "c", rule, prepared=str(tiny_en_de))
    k = meta["mix"]["replaced"]
    assert 0 < k < N
    order = rule.order(SentenceScores.read(DistilledSet(kd).scores_file), np.zeros(N, dtype=bool))

    def c_with(count):
        replace = np.zeros(N, dtype=bool)
        replace[order[:count]] = True
        return complexity_of(sources, mix_targets(targets, refs, replace), names)

    reached = (lambda c: c <= target) if start > end else (lambda c: c >= target)
    assert reached(c_with(k)) and not reached(c_with(k - 1))
    assert lines(tmp_path / "c" / "valid.de") == mix_targets(targets, refs, np.isin(np.arange(N), order[:k]))


def test_real_targets_are_encoded_like_the_prepared_corpus_when_only_a_model_is_given(tiny_en_de):
    """Without a prepared corpus the references are encoded with --spm-model (or the set's recorded
    --bpe/--tokenizer): the very pieces nat_kd.prepare wrote for its bin/."""
    from nat_kd.artifacts import PreparedCorpus
    from nat_kd.mix import real_pieces

    prepared = PreparedCorpus(tiny_en_de)
    reference = str(prepared.raw("valid", "de"))
    expected = prepared.pieces("valid", "de").read_text(encoding="utf-8").splitlines()
    assert real_pieces(None, reference, str(tiny_en_de / "spm.model"), "valid", "de") == expected
    recorded = {"bpe": {"_name": "sentencepiece", "sentencepiece_model": str(tiny_en_de / "spm.model")},
                "tokenizer": None, "post_process": None, "detokenized": True}
    assert real_pieces(None, reference, None, "valid", "de", recorded) == expected
    with pytest.raises(SettingsError, match="--spm-model"):
        real_pieces(None, reference, None, "valid", "de", {"detokenized": False})


def test_an_out_that_is_a_file_or_holds_other_files_is_refused(distilled, tiny_en_de, tmp_path):
    """The mix replaces --out whole: a plain file, or a folder that is not a distilled set, is left alone."""
    kd = distilled[0]
    plain = tmp_path / "plain"
    plain.write_text("keep me")
    with pytest.raises(SettingsError, match=r"plain is a file, not a folder"):
        mix(kd, plain, MixRule(repeated=True), prepared=str(tiny_en_de))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(SettingsError, match=r"folder exists and is not a distilled set \(no meta\.json\)"):
        mix(kd, folder, MixRule(repeated=True), prepared=str(tiny_en_de))
    assert plain.read_text() == (folder / "notes.txt").read_text() == "keep me"


def test_a_prepared_corpus_in_other_tokens_is_refused(distilled, tiny_en_de, tmp_path, capsys):
    """The same Multi30k valid split prepared with its own sentencepiece model: its pieces are not the set's
    tokens (11% of them would be <unk> in the set's dictionary), so the mix stops before writing anything."""
    from nat_kd.prepare import PrepareConfig, prepare

    kd = distilled[0]
    valid = str(tiny_en_de / "raw" / "valid")
    other = prepare(PrepareConfig("en", "de", vocab_size=250, trainpref=valid, validpref=valid),
                    out_dir=tmp_path / "other", workers=1)
    out = tmp_path / "mixed"
    assert main(["--distilled", str(kd), "--prepared", str(other), "--repeated", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (f"--prepared {other} is tokenized with sentencepiece model sha256 {sha256_file(other / 'spm.model')[:12]}, "
            f"but {kd / 'meta.json'} records sentencepiece model sha256 {sha256_file(tiny_en_de / 'spm.model')[:12]}"
            in err)
    assert "pass the prepared corpus the teacher was trained on" in err
    assert not out.exists()


def test_target_complexity_of_a_set_without_outputs_names_its_files(tiny_en_de, tmp_path, capsys):
    kd = tmp_path / "kd"
    write_distilled(tiny_en_de, kd, empty_outputs=True)
    out = tmp_path / "mixed"
    assert main(["--distilled", str(kd), "--prepared", str(tiny_en_de), "--target-complexity", "0.5",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: {kd / 'valid.en'} and {kd / 'valid.de'} with 0 of its lines from {tiny_en_de / 'raw' / 'valid.de'}: "
        f"every one of its {N} sentence pairs has an empty side, nothing to align; check that both hold text\n")
    assert not out.exists()


@pytest.fixture(scope="module")
def judge(tiny_en_de, tmp_path_factory):
    """A micro vanilla NAT trained a few updates on the tiny corpus's real data: the judge."""
    from conftest import MICRO_MODEL, ROOT, run_fairseq

    save = tmp_path_factory.mktemp("judge")
    run_fairseq("train", tiny_en_de / "bin", "--user-dir", ROOT / "fairseq_plugins", "--task", "translation_lev",
                "--criterion", "nat_loss", "--noise", "full_mask", "--pred-length-offset", "--arch", "kd_nat_tiny",
                *MICRO_MODEL, "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "2048",
                "--required-batch-size-multiple", "1", "--max-update", "6", "--save-dir", save,
                "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1")
    return save / "checkpoint_last.pt"


@pytest.mark.slow
def test_the_judge_rule_keeps_the_distilled_targets_the_judge_scores_best(distilled, tiny_en_de, judge, tmp_path):
    """The judge (a NAT) translates each source; a line's score is the mean of its
    output's sentence BLEU against the distilled target and the distilled target's against the real one; the
    best 30% keep the distilled target. Checked against fairseq-generate and sacrebleu run here."""
    from conftest import ROOT, run_fairseq
    from nat_kd.artifacts import PreparedCorpus

    kd, refs, targets = distilled
    flags = PreparedCorpus(tiny_en_de).tokenization().fairseq_flags("en", "de")
    printed = run_fairseq("generate", kd / "bin", "--user-dir", ROOT / "fairseq_plugins", "--task",
                          "translation_lev", "--iter-decode-max-iter", "0", "--beam", "1", "--path", judge,
                          "--gen-subset", "valid", "--max-tokens", "8192", *flags)
    outputs = {int(line.split("\t")[0][2:]): line.split("\t")[2] for line in printed.splitlines()
               if line.startswith("D-")}
    # a source longer than the micro model takes gets no output: scored as an empty one
    assert 0 < N - len(outputs) < 10
    score = np.array([(sacrebleu.sentence_bleu(outputs.get(i, ""), [targets[i]]).score
                       + sacrebleu.sentence_bleu(targets[i], [refs[i]]).score) / 2 for i in range(N)])
    kept = np.zeros(N, dtype=bool)
    kept[np.argsort(-score, kind="stable")[:int(np.ceil(0.3 * N))]] = True
    meta = mix(kd, tmp_path / "s", MixRule(judge=str(judge), distilled_share=0.3), prepared=str(tiny_en_de))
    assert meta["mix"]["replaced"] == N - kept.sum() and meta["mix"]["judge"]["kept"] == kept.sum()
    assert lines(tmp_path / "s" / "valid.de") == [t if k else r for t, r, k in zip(targets, refs, kept)]
    assert meta["mix"]["rule"] == "outside the 30% best by the judge's score"
    assert meta["mix"]["judge"]["judge_sha256"] == sha256_file(judge)
    card = json.loads((tmp_path / "s" / "card.json").read_text())
    assert "outside the 30% best by the judge's score" in json.dumps(card)  # the card records the rule


@pytest.mark.parametrize("argv, message", [
    (["--judge", "x.pt"], "--judge and --distilled-share go together"),
    (["--judge", "x.pt", "--distilled-share", "1.5"], "--distilled-share 1.5: a share of the lines"),
    (["--judge", "x.pt", "--distilled-share", "0.2", "--target-complexity", "1.0"], "give one of them"),
])
def test_a_judge_rule_that_cannot_work_is_refused_in_one_line(distilled, tiny_en_de, tmp_path, capsys, argv,
                                                                  message):
    assert main(["--distilled", str(distilled[0]), "--prepared", str(tiny_en_de), "--out", str(tmp_path / "o"),
                 *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
