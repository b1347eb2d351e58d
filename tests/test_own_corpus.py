"""A corpus and teacher brought from outside: Moses tokens, subword-nmt BPE, fairseq-preprocess, a plain fairseq
transformer (scripts/experiments/make_foreign_corpus.sh, which uses nothing of nat_kd). The generator must keep
the teacher's own tokens, detokenize with fairseq's encoders exactly as fairseq-generate does, and lose nothing."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from conftest import ROOT, run_fairseq
from nat_kd.distill import DistillConfig, distill
from nat_kd.distill.decoding import DecodingSettings
from nat_kd.tokenization import TokenizationSettings
from nat_kd.generate_distilled import main

N_VALID = 100  # the script's valid and test slices
BEAM = dict(strategy="beam", beam=4, max_len_b=20)


@pytest.fixture(scope="session")
def foreign(tmp_path_factory):
    """500 training pairs of Multi30k en-fr, 300 BPE merges, a micro teacher of 80 updates."""
    out = tmp_path_factory.mktemp("foreign")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    script = ROOT / "scripts" / "experiments" / "make_foreign_corpus.sh"
    proc = subprocess.run(["bash", str(script), str(out)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return out


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def fairseq_generate(foreign):
    """fairseq-generate's H (tokens), D (detokenized) and T (reference) lines by sentence id."""
    log = run_fairseq("generate", foreign / "data-bin", "--user-dir", "fairseq_plugins", "--gen-subset", "valid",
                      "--path", foreign / "teacher" / "checkpoint_last.pt", "--beam", "4", "--max-len-a", "0",
                      "--max-len-b", "20", "--max-tokens", "300", "--required-batch-size-multiple", "1",
                      "--bpe", "subword_nmt", "--bpe-codes", foreign / "code", "--tokenizer", "moses",
                      "--source-lang", "en", "--target-lang", "fr")
    found = {kind: {int(m.group(1)): m.group(2)
                    for m in re.finditer(rf"^{kind}-(\d+)\t(?:[^\t\n]*\t)?(.*)$", log, re.M)}
             for kind in ("H", "D", "T")}
    return {kind: [by_id[i] for i in range(len(by_id))] for kind, by_id in found.items()}


@pytest.fixture(scope="module")
def from_checkpoint(foreign, tmp_path_factory):
    """The command a WMT user types: the binarized folder and the teacher, nothing else (the teacher's
    checkpoint records --bpe subword_nmt --tokenizer moses)."""
    out = tmp_path_factory.mktemp("runs") / "beam4"
    code = main(["--teacher-path", str(foreign / "teacher" / "checkpoint_last.pt"), "--data", str(foreign / "data-bin"),
                 "--split", "valid", "--beam", "4", "--max-len-b", "20", "--max-tokens", "300", "--workers", "1",
                 "--threads", "1", "--no-progress-bar", "--out", str(out)])
    assert code == 0
    return out


@pytest.mark.slow
def test_output_is_fairseq_generates_in_the_teachers_tokens_and_detokenized(from_checkpoint, fairseq_generate):
    tokens, text = lines(from_checkpoint / "spm" / "valid.fr"), lines(from_checkpoint / "valid.fr")
    assert len(tokens) == len(text) == len(fairseq_generate["H"]) == N_VALID
    assert tokens == fairseq_generate["H"]  # beam search, token for token
    assert text == fairseq_generate["D"]  # detokenized as fairseq-generate's decode_fn does
    assert sum("@@ " in line for line in tokens) > 10  # the teacher's BPE units are kept
    assert not any("@@" in line for line in text)


def test_binarized_output_holds_the_teachers_tokens(from_checkpoint, foreign):
    from fairseq.data import Dictionary, data_utils

    bin_dir = from_checkpoint / "bin"
    assert (bin_dir / "dict.fr.txt").read_bytes() == (foreign / "data-bin" / "dict.fr.txt").read_bytes()
    dictionary = Dictionary.load(str(bin_dir / "dict.fr.txt"))
    target = data_utils.load_indexed_dataset(str(bin_dir / "valid.en-fr.fr"), dictionary)
    assert [dictionary.string(target[i]) for i in range(len(target))] == lines(from_checkpoint / "spm" / "valid.fr")
    source = data_utils.load_indexed_dataset(str(bin_dir / "valid.en-fr.en"), dictionary)
    original = data_utils.load_indexed_dataset(str(foreign / "data-bin" / "valid.en-fr.en"), dictionary)
    assert len(source) == len(original) == N_VALID  # nothing lost, in the input's order
    assert all(source[i].tolist() == original[i].tolist() for i in range(N_VALID))


def test_source_copy_and_scores_are_detokenized_text(from_checkpoint, foreign, fairseq_generate):
    from sacremoses import MosesDetokenizer

    # the source copy: the binarized source with BPE undone and Moses-detokenized in the source language
    tokens = lines(from_checkpoint / "spm" / "valid.en")
    expected = [MosesDetokenizer("en").detokenize((line + " ").replace("@@ ", "").split()) for line in tokens]
    assert lines(from_checkpoint / "valid.en") == expected
    raw = lines(foreign / "raw" / "valid.en")
    assert sum(a == b for a, b in zip(expected, raw)) > N_VALID * 0.9  # Moses round trips almost every line
    # the references are the binarized target side, decoded as fairseq-generate decodes it (its T lines)
    meta = json.loads((from_checkpoint / "meta.json").read_text())
    assert meta["tokenization"]["bpe"]["_name"] == "subword_nmt" and meta["tokenization"]["detokenized"]
    assert "binarized target side" in meta["corpus"]["reference"]
    bleu = sacrebleu.corpus_bleu(fairseq_generate["D"], [fairseq_generate["T"]])
    assert meta["scores"]["bleu"] == round(bleu.score, 4)
    assert meta["files"]["original_splits_in_bin"] == ["test", "train"]


def test_raw_text_is_encoded_as_the_corpus_was(from_checkpoint, foreign, tmp_path):
    """Raw source and reference through fairseq's moses + subword_nmt encoders give the ids fairseq-preprocess
    stored (the same hypotheses, batched the same)."""
    settings = TokenizationSettings(bpe={"_name": "subword_nmt", "bpe_codes": str(foreign / "code")},
                                    tokenizer={"_name": "moses"})
    out = distill(DistillConfig(
        teachers=[str(foreign / "teacher" / "checkpoint_last.pt")], out_dir=str(tmp_path / "raw"), split="valid",
        source=str(foreign / "raw" / "valid.en"), reference=str(foreign / "raw" / "valid.fr"), tokenization=settings,
        decoding=DecodingSettings(**BEAM), max_tokens=300, workers=1, threads=1, progress_bar=False)).out_dir
    assert lines(out / "spm" / "valid.en") == lines(from_checkpoint / "spm" / "valid.en")
    assert lines(out / "spm" / "valid.fr") == lines(from_checkpoint / "spm" / "valid.fr")
    assert lines(out / "valid.en") == lines(foreign / "raw" / "valid.en")  # the source as given


def test_post_process_only_decodes_without_the_codes(from_checkpoint, foreign, tmp_path):
    settings = TokenizationSettings(post_process="subword_nmt", tokenizer={"_name": "moses"})
    out = distill(DistillConfig(
        teachers=[str(foreign / "teacher" / "checkpoint_last.pt")], out_dir=str(tmp_path / "pp"), split="valid",
        data_dir=str(foreign / "data-bin"), tokenization=settings, decoding=DecodingSettings(**BEAM), max_tokens=300,
        workers=1, threads=1, progress_bar=False)).out_dir
    assert lines(out / "valid.fr") == lines(from_checkpoint / "valid.fr")


def test_no_detokenization_warns_and_scores_tokens(from_checkpoint, foreign, tmp_path, caplog):
    code = main(["--teacher-path", str(foreign / "teacher" / "checkpoint_last.pt"), "--data", str(foreign / "data-bin"),
                 "--split", "valid", "--bpe", "none", "--strategy", "seq-inter", "--beam", "4", "--max-len-b", "20",
                 "--max-tokens", "300", "--workers", "1", "--threads", "1", "--no-progress-bar",
                 "--out", str(tmp_path / "tok")])
    assert code == 0
    assert "BLEU/chrF are computed on tokens" in caplog.text
    out = tmp_path / "tok"
    assert lines(out / "valid.fr") == lines(out / "spm" / "valid.fr")  # text stays in tokens
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenization"]["detokenized"] is False
    # seq-inter reranked against the binarized references, in tokens: never worse than beam per sentence
    references = lines(foreign / "bpe" / "valid.fr")
    metric = sacrebleu.BLEU(effective_order=True)
    beam, inter = ([metric.sentence_score(h, [r]).score for h, r in zip(lines(hypotheses), references)]
                   for hypotheses in (from_checkpoint / "spm" / "valid.fr", out / "valid.fr"))
    assert all(i >= b - 1e-9 for i, b in zip(inter, beam)) and sum(inter) > sum(beam)


def test_bad_tokenization_options_are_clear_errors(foreign, tmp_path, capsys):
    common = ["--teacher-path", str(foreign / "teacher" / "checkpoint_last.pt"), "--split", "valid", "--workers", "1",
              "--no-progress-bar", "--out", str(tmp_path / "o")]
    assert main([*common, "--data", str(foreign / "data-bin"), "--bpe", "subword_nmt"]) == 2
    assert "--bpe subword_nmt needs --bpe-codes" in capsys.readouterr().err
    assert main([*common, "--data", str(foreign / "data-bin"), "--bpe", "subword_nmt", "--bpe-codes",
                 str(tmp_path / "nope")]) == 2
    assert "nope does not exist" in capsys.readouterr().err
    assert main([*common, "--source", str(foreign / "raw" / "valid.en"), "--post-process", "subword_nmt"]) == 2
    assert "needs the BPE itself" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- nat_kd.prepare on an own corpus

def test_prepare_with_bpe_codes_gives_the_corpus_tokens(foreign, tmp_path):
    """Raw files by prefix, fairseq's moses + subword_nmt encoders: the tokens the command-line tools wrote
    (sacremoses tokenize -a, subword-nmt apply-bpe), and one dictionary per language when asked."""
    from nat_kd.artifacts import PreparedCorpus
    from nat_kd.prepare import main as prepare_main

    out = tmp_path / "bpe"
    assert prepare_main(["--src", "en", "--tgt", "fr", "--trainpref", str(foreign / "raw" / "train"),
                         "--validpref", str(foreign / "raw" / "valid"), "--bpe-codes", str(foreign / "code"),
                         "--tokenizer", "moses", "--separate-dictionaries", "--out-dir", str(out),
                         "--workers", "1"]) == 0
    prepared = PreparedCorpus(out)
    for split in ("train", "valid"):
        for lang in ("en", "fr"):
            assert lines(prepared.pieces(split, lang)) == lines(foreign / "bpe" / f"{split}.{lang}")
            assert lines(prepared.raw(split, lang)) == lines(foreign / "raw" / f"{split}.{lang}")
    assert not prepared.bin.prefix("test", "en", "fr", "en").with_suffix(".bin").exists()  # no --testpref
    assert prepared.bin.dictionary("en").read_text() != prepared.bin.dictionary("fr").read_text()
    settings = prepared.tokenization()  # what generate_distilled --prepared detokenizes with
    assert settings.bpe == {"_name": "subword_nmt", "bpe_codes": str(prepared.bpe_codes)}
    assert settings.tokenizer == {"_name": "moses"}
    assert prepared.bpe_codes.read_bytes() == (foreign / "code").read_bytes()


def test_prepare_pretokenized_only_binarizes_as_fairseq_preprocess(foreign, tmp_path):
    from nat_kd.prepare import PrepareConfig, prepare

    cfg = PrepareConfig("en", "fr", trainpref=str(foreign / "bpe" / "train"), validpref=str(foreign / "bpe" / "valid"),
                        testpref=str(foreign / "bpe" / "test"), pretokenized=True)
    out = prepare(cfg, out_dir=tmp_path / "pre", workers=1)
    theirs = foreign / "data-bin"
    for name in ("dict.en.txt", "dict.fr.txt", *(f"{s}.en-fr.{lang}.{ext}" for s in ("train", "valid", "test")
                                                 for lang in ("en", "fr") for ext in ("bin", "idx"))):
        assert (out / "bin" / name).read_bytes() == (theirs / name).read_bytes(), name


def test_prepare_with_an_existing_sentencepiece_model(tiny_en_de, tmp_path):
    from nat_kd.artifacts import PreparedCorpus
    from nat_kd.prepare import PrepareConfig, prepare

    cfg = PrepareConfig("en", "de", trainpref=str(tiny_en_de / "raw" / "valid"),
                        spm_model=str(tiny_en_de / "spm.model"))
    out = PreparedCorpus(prepare(cfg, out_dir=tmp_path / "spm", workers=1))
    for lang in ("en", "de"):
        assert lines(out.pieces("train", lang)) == lines(tiny_en_de / "spm" / f"valid.{lang}")
    assert out.tokenization().bpe == {"_name": "sentencepiece", "sentencepiece_model": str(out.spm_model)}


def test_multi30k_settings_and_bad_own_corpus_options():
    from nat_kd.errors import SettingsError
    from nat_kd.prepare import PrepareConfig

    # the fields of an own corpus stay out of a Multi30k fingerprint: folders prepared before them stay valid
    from nat_kd.corpus import data_dir
    from nat_kd.hashing import sha256_file, sha256_json
    from nat_kd.prepare import fingerprint

    before = {"src": "en", "tgt": "de", "vocab_size": 8000, "spm_model_type": "unigram", "train_limit": None}
    assert PrepareConfig("en", "de").settings() == before
    files = {f"{split}.{lang}.gz": sha256_file(data_dir() / f"{split}.{lang}.gz")
             for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")}
    assert fingerprint(data_dir(), PrepareConfig("en", "de"))[0] == sha256_json(
        {"config": before, "version": 1, "inputs": files})  # the formula of prepare version 1
    with pytest.raises(SettingsError, match="pass --trainpref too"):
        PrepareConfig("en", "de", bpe_codes="codes")
    with pytest.raises(SettingsError, match="choose one of"):
        PrepareConfig("en", "ro", trainpref="t", bpe_codes="codes", pretokenized=True)
    with pytest.raises(SettingsError, match="--tokenizer is the word tokenizer under --bpe-codes"):
        PrepareConfig("en", "ro", trainpref="t", tokenizer="moses")


def test_prepare_fingerprint_is_the_content_not_the_place(foreign, tmp_path):
    import shutil

    from nat_kd.prepare import PrepareConfig, fingerprint

    def key(root):
        return fingerprint(None, PrepareConfig("en", "fr", trainpref=str(root / "raw" / "train"),
                                               validpref=str(root / "raw" / "valid"), bpe_codes=str(root / "code"),
                                               tokenizer="moses"))[0]

    moved = tmp_path / "moved"
    shutil.copytree(foreign / "raw", moved / "raw")
    shutil.copyfile(foreign / "code", moved / "code")
    assert key(moved) == key(foreign)
    (moved / "raw" / "valid.fr").write_text("changed\n" * N_VALID)
    assert key(moved) != key(foreign)
