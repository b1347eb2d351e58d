"""Published teachers (nat_kd/distill/teachers.py): tiny Hugging Face MarianMT and M2M100 models built here
(random weights, sentencepiece models trained on the tiny Multi30k slice, nothing downloaded), and a
CTranslate2 folder as OPUS-MT conversions ship it; distilled, checked against transformers' own generate,
re-encoded into the student's vocabulary and trained on by a NAT student."""
import json
import logging
import shutil
import subprocess
import sys

import pytest
from conftest import (EMPTY_LINE, N_LINES, ROOT, kill_after_first_chunk_and_resume, lines, marian_teacher, output_bytes,
                      python_m, tiny, train_and_decode, train_sentencepiece)

from nat_kd.distill import DistillConfig, distill
from nat_kd.distill.decoding import DecodingSettings
from nat_kd.errors import SettingsError

transformers = pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

MAX_LEN = 12
TRAIN_LINES = 203  # tiny_en_de's training split


@pytest.fixture(scope="module")
def teachers(tiny_en_de, tmp_path_factory):
    """{"marian": folder, "m2m100": folder, "ct2": folder, "m2m100-ct2": folder}: the teachers' vocabularies
    are not the student's
    (tiny_en_de's joint 300-piece model): Marian has one sentencepiece model per language (150 pieces), M2M100 a
    joint BPE one (200 pieces, a BPE model as M2M100's sentencepiece.bpe.model is) and the language codes; as in
    M2M100's real 128k vocabulary, the plain pieces de, en and a are there beside the language tokens __de__ and
    __en__; "ct2" is the Marian model as an OPUS-MT CTranslate2 conversion ships it (model.bin, vocabulary,
    source.spm, target.spm), "m2m100-ct2" the M2M100 model converted, with its sentencepiece.bpe.model."""
    import torch
    from ctranslate2.converters import TransformersConverter
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    work = tmp_path_factory.mktemp("published")
    text = {lang: lines(tiny_en_de / "raw" / f"train.{lang}") for lang in ("en", "de")}
    models = {}
    torch.manual_seed(1)
    models["marian"] = marian_teacher(text["en"], text["de"], work, work / "marian")

    joint = train_sentencepiece(text["en"] + text["de"], work / "sp_joint", 200, "bpe")
    encoder = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(joint.get_piece_size()):
        encoder.setdefault(joint.id_to_piece(i), len(encoder))
    assert {"de", "en", "a"} <= encoder.keys()  # plain pieces, as in a real M2M100 vocabulary
    (work / "m2m_vocab.json").write_text(json.dumps(encoder), encoding="utf-8")
    models["m2m100"] = work / "m2m100"
    tokenizer = M2M100Tokenizer(vocab_file=str(work / "m2m_vocab.json"), spm_file=str(work / "sp_joint.model"),
                                src_lang="en", tgt_lang="de", model_max_length=512,
                                additional_special_tokens=[f"__{c}__" for c in FAIRSEQ_LANGUAGE_CODES["m2m100"]])
    tokenizer.save_pretrained(models["m2m100"])
    M2M100ForConditionalGeneration(tiny(
        M2M100Config, len(tokenizer.get_vocab()) + tokenizer.num_madeup_words, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2)).save_pretrained(models["m2m100"])

    models["ct2"] = work / "opus-mt-ct2"
    TransformersConverter(str(models["marian"])).convert(str(models["ct2"]))
    for name in ("source.spm", "target.spm"):
        (models["ct2"] / name).write_bytes((models["marian"] / name).read_bytes())
    models["m2m100-ct2"] = work / "m2m100-ct2"
    TransformersConverter(str(models["m2m100"])).convert(str(models["m2m100-ct2"]))
    spm = "sentencepiece.bpe.model"
    (models["m2m100-ct2"] / spm).write_bytes((models["m2m100"] / spm).read_bytes())
    return models


CODES = {name: dict(teacher_src_lang="en", teacher_tgt_lang="de") for name in ("m2m100", "m2m100-ct2")}


def published(teachers, name, tiny_en_de, out, split="train", **kw):
    decoding = {k: kw.pop(k) for k in list(kw) if k in DecodingSettings.__dataclass_fields__}
    decoding.setdefault("max_len_b", MAX_LEN)
    kw.setdefault("source", str(tiny_en_de / "raw" / f"{split}.en"))
    kw.setdefault("reference", str(tiny_en_de / "raw" / f"{split}.de"))
    return DistillConfig(teachers=[str(teachers[name])], out_dir=str(out), split=split,
                         decoding=DecodingSettings(**decoding), ct2_cache=str(out.parent / "cache"), workers=1,
                         threads=1, progress_bar=False, **{**CODES.get(name, {}), **kw})


@pytest.mark.parametrize("name", ["marian", "m2m100"])
@pytest.mark.slow
def test_hugging_face_teacher_agrees_with_transformers_generate(teachers, tiny_en_de, tmp_path, name, caplog):
    """Beam 4 on the training split: the check against transformers' generate is recorded and (same model,
    same search) finds the same hypotheses; the output is line-aligned and detokenized by the teacher's own
    tokenizer; the model is converted once, then found in the cache."""
    result = distill(published(teachers, name, tiny_en_de, tmp_path / "a", strategy="beam", beam=4,
                               check_against_transformers=TRAIN_LINES))
    out, meta = result.out_dir, result.meta
    check = meta["check_against_transformers"]
    assert check["sentences"] == TRAIN_LINES and check["identical_share"] >= 0.95, check
    assert not low_agreement_warnings(caplog)
    assert lines(out / "train.en") == lines(tiny_en_de / "raw" / "train.en")
    pieces = lines(out / "spm" / "train.de")
    assert len(pieces) == len(lines(out / "train.de")) == TRAIN_LINES
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(teachers[name]), **(
        {"src_lang": "en", "tgt_lang": "de"} if name == "m2m100" else {}))
    assert lines(out / "train.de") == [tokenizer.decode(tokenizer.convert_tokens_to_ids(p.split()),
                                                        skip_special_tokens=True) for p in pieces]
    assert len(set(pieces)) > 20  # the random teacher's outputs depend on the source
    teacher = meta["teacher"]
    assert teacher["converter"] == "ctranslate2.converters.TransformersConverter" and teacher["kind"] == "transformers"
    assert teacher["target_prefix"] == (["__de__"] if name == "m2m100" else [])
    converted = [p for p in (tmp_path / "cache").iterdir() if (p / "model.bin").is_file()]
    assert len(converted) == 1
    again = distill(published(teachers, name, tiny_en_de, tmp_path / "b", strategy="greedy"))
    assert [p for p in (tmp_path / "cache").iterdir() if (p / "model.bin").is_file()] == converted
    assert again.meta["teacher"]["sha256"] == teacher["sha256"]


@pytest.mark.slow
def test_greedy_equals_transformers_generate_written_out(teachers, tiny_en_de, tmp_path):
    """The reference spelled out here, without the toolkit: M2M100's greedy search by transformers, the target
    language token forced first, at most MAX_LEN tokens then EOS. The model's made-up words (ids past the
    tokenizer's vocabulary, which calls them all <unk>; the random teacher writes some) are named as in
    CTranslate2's vocabulary."""
    import torch

    result = distill(published(teachers, "m2m100", tiny_en_de, tmp_path / "g", strategy="greedy",
                               check_against_transformers=TRAIN_LINES))
    out = result.out_dir
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(teachers["m2m100"]), src_lang="en", tgt_lang="de")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(teachers["m2m100"])).eval()
    source = lines(tiny_en_de / "raw" / "train.en")[:40]
    expected = []
    for line in source:
        ids = tokenizer(line).input_ids
        ids = ids if len(ids) <= 512 else ids[:511] + [tokenizer.eos_token_id]  # truncated as the generator does
        with torch.inference_mode():
            generated = model.generate(torch.tensor([ids]), num_beams=1, do_sample=False, max_new_tokens=MAX_LEN + 2,
                                       forced_bos_token_id=tokenizer.get_lang_id("de"),
                                       forced_eos_token_id=tokenizer.eos_token_id)[0, 2:].tolist()
        tokens = [f"madeupword{i - len(tokenizer)}" if i >= len(tokenizer) else tokenizer.convert_ids_to_tokens(i)
                  for i in generated]
        expected.append(" ".join(tokens[:tokens.index("</s>")] if "</s>" in tokens else tokens))
    assert lines(out / "spm" / "train.de")[:40] == expected
    # so does the check, made-up words included: the same argmax, token by token
    assert result.meta["check_against_transformers"]["identical"] == TRAIN_LINES


def low_agreement_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "usual causes" in r.getMessage()]


def test_check_against_transformers_finds_a_wrong_language_token(teachers, tiny_en_de, tmp_path, monkeypatch,
                                                                  caplog):
    """The check forces the target language's token as transformers' documentation does
    (tokenizer.get_lang_id), not the token the generator decodes from: a generator that started from the plain
    piece de (as it once did) is caught, almost no hypothesis agrees, and the warning names both tokens. (Those
    that agree are mostly the random teacher's repetitions, such as "j j j ...", whatever its first token.)"""
    from nat_kd.distill.teachers import PublishedTeacher

    init = PublishedTeacher.__init__

    def plain_piece(self, *args, **kw):
        init(self, *args, **kw)
        self.target_prefix = ["de"]

    monkeypatch.setattr(PublishedTeacher, "__init__", plain_piece)
    result = distill(published(teachers, "m2m100", tiny_en_de, tmp_path / "w", strategy="beam", beam=4,
                               check_against_transformers=TRAIN_LINES))
    assert result.meta["teacher"]["target_prefix"] == ["de"]
    check = result.meta["check_against_transformers"]
    assert check["identical_share"] < 0.2, check
    [warning] = low_agreement_warnings(caplog)
    assert "CTranslate2 started from de, transformers from __de__" in warning


def test_low_agreement_names_the_usual_causes(teachers, tiny_en_de, tmp_path, caplog):
    """A MarianMT whose <pad> embedding is not zero: transformers starts the decoder from it, CTranslate2 from
    zeros, and almost no hypothesis agrees. The warning names the usual causes, this model's <pad> among them."""
    import torch

    folder = tmp_path / "marian-pad"
    shutil.copytree(teachers["marian"], folder)
    model = transformers.MarianMTModel.from_pretrained(str(folder))
    torch.manual_seed(0)
    with torch.no_grad():
        model.get_decoder().embed_tokens.weight[model.config.decoder_start_token_id] = torch.randn(32)
    model.save_pretrained(folder)
    result = distill(published({"pad": folder}, "pad", tiny_en_de, tmp_path / "o", strategy="beam", beam=4,
                               check_against_transformers=40))
    check = result.meta["check_against_transformers"]
    assert check["identical_share"] < 0.2, check
    [warning] = low_agreement_warnings(caplog)
    assert f"only {check['identical']} of 40 hypotheses are identical" in warning
    assert "a non-zero <pad> embedding: CTranslate2 starts MarianMT's decoder from zeros" in warning
    assert "(this model's is non-zero)" in warning and "a tokenizer that is not the model's" in warning


@pytest.mark.parametrize("strategy, settings", [("beam", dict(beam=3)), ("greedy", {}), ("sampling", {}),
                                                ("topk", dict(top_k=5)), ("topp", dict(top_p=0.8)),
                                                ("seq-inter", dict(beam=3))])
@pytest.mark.slow
def test_every_strategy_with_a_published_teacher(teachers, tiny_en_de, corpus, tmp_path, strategy,  # noqa: F811
                                                 settings):
    """The 48-line corpus with an empty and an over-long source: line-aligned; sampled ones reproduce."""
    kw = dict(split="valid", source=str(corpus / "src.en"), reference=str(corpus / "ref.de"), strategy=strategy,
              max_tokens=600, **settings)
    first = distill(published(teachers, "m2m100", tiny_en_de, tmp_path / "a", **kw))
    target = lines(first.out_dir / "valid.de")
    assert len(target) == N_LINES and target[EMPTY_LINE - 1] == ""
    assert first.meta["empty_source_lines"] == [EMPTY_LINE] and first.meta["truncated_source_lines"]
    pieces = lines(first.out_dir / "spm" / "valid.de")
    assert len(pieces) == N_LINES and [i + 1 for i, p in enumerate(pieces) if not p] == [EMPTY_LINE]
    if strategy in ("sampling", "topk", "topp"):
        second = distill(published(teachers, "m2m100", tiny_en_de, tmp_path / "b", **kw))
        assert output_bytes(second.out_dir) == output_bytes(first.out_dir)
        greedy = distill(published(teachers, "m2m100", tiny_en_de, tmp_path / "c", **{**kw, "strategy": "greedy"}))
        assert lines(greedy.out_dir / "valid.de") != target  # it did sample


@pytest.mark.parametrize("ct2, hf", [("ct2", "marian"), ("m2m100-ct2", "m2m100")])
@pytest.mark.slow
def test_ctranslate2_folder_as_opus_mt_ships_it(teachers, tiny_en_de, tmp_path, ct2, hf):
    """The converted model with its sentencepiece models (Marian: source.spm/target.spm, M2M100:
    sentencepiece.bpe.model): the same hypotheses as the Hugging Face folder (the sentencepiece models
    tokenize as the folder's tokenizer does, and M2M100 starts from the language tokens __en__ and __de__, not
    from the plain pieces en and de); nothing is converted."""
    folder = distill(published(teachers, ct2, tiny_en_de, tmp_path / "ct2", strategy="beam", beam=3))
    hf = distill(published(teachers, hf, tiny_en_de, tmp_path / "hf", strategy="beam", beam=3))
    for name in ("spm/train.en", "spm/train.de", "train.de"):
        assert lines(folder.out_dir / name) == lines(hf.out_dir / name), name
    assert folder.meta["teacher"]["target_prefix"] == hf.meta["teacher"]["target_prefix"]
    assert folder.meta["teacher"]["kind"] == "ctranslate2" and folder.meta["teacher"]["converter"] is None
    assert not any((p / "model.bin").is_file() for p in (tmp_path / "cache").iterdir()
                   if p.name != hf.meta["teacher"]["ctranslate2_model"].rsplit("/", 1)[-1])


@pytest.mark.slow
def test_student_vocabulary_bin_trains_a_nat_student(teachers, tiny_en_de, tmp_path):
    """--student-data: bin/ is what fairseq-preprocess makes of the texts in the student's tokens (the source
    side byte for byte the student's own binarized split), its <unk> share is counted, and a NAT student
    trains on it."""
    import sentencepiece
    from fairseq.data import Dictionary
    from fairseq_plugins.models.nat import STUDENT_FAMILIES

    from nat_kd.distill.source import load_binarized

    result = distill(published(teachers, "marian", tiny_en_de, tmp_path / "s", strategy="beam", beam=3,
                               student_data=str(tiny_en_de)))
    out = result.out_dir
    for suffix in ("bin", "idx"):
        assert (out / "bin" / f"train.en-de.en.{suffix}").read_bytes() == \
            (tiny_en_de / "bin" / f"train.en-de.en.{suffix}").read_bytes()
    assert (out / "bin" / "dict.de.txt").read_bytes() == (tiny_en_de / "bin" / "dict.de.txt").read_bytes()
    assert sorted(result.meta["files"]["original_splits_in_bin"]) == ["test", "valid"]
    student = sentencepiece.SentencePieceProcessor(model_file=str(tiny_en_de / "spm.model"))
    dictionary = Dictionary.load(str(tiny_en_de / "bin" / "dict.de.txt"))
    expected = [" ".join(student.encode(line, out_type=str)) for line in lines(out / "train.de")]
    stored = load_binarized(out / "bin", "train", "de", "en-de", dictionary)
    assert [dictionary.string(t) for t in stored] == [
        " ".join(p if p in dictionary.indices else "<unk>" for p in line.split()) for line in expected]
    unknown = sum(p not in dictionary.indices for line in expected for p in line.split())
    recorded = result.meta["student_vocabulary"]["target"]
    assert recorded["tokens"] == sum(len(line.split()) for line in expected) and recorded["unk"] == unknown
    assert result.meta["student_vocabulary"]["source"]["unk"] == 0
    spec = STUDENT_FAMILIES["nat"]
    hyps = train_and_decode(out / "bin", tmp_path / "student", "kd_nat_tiny",
                            ("--task", "translation_lev", "--criterion", "nat_loss", *spec.train_flags),
                            spec.decode_flags)
    assert sorted(hyps) == list(range(TRAIN_LINES))


@pytest.mark.slow
def test_killed_run_resumes_to_identical_output(teachers, tiny_en_de, corpus, tmp_path):  # noqa: F811
    """topk by the command line, killed after its first chunk and run again: the same bytes as a whole run."""
    args = ["--teacher-path", str(teachers["m2m100"]), "--teacher-src-lang", "en", "--teacher-tgt-lang", "de",
            "--split", "valid", "--source", str(corpus / "src.en"), "--reference", str(corpus / "ref.de"),
            "--strategy", "topk", "--max-len-b", str(MAX_LEN), "--max-tokens", "600", "--max-sentences", "6",
            "--chunk-sentences", "6", "--ct2-cache", str(tmp_path / "cache"), "--workers", "1", "--threads", "1",
            "--no-progress-bar"]
    whole = tmp_path / "whole"
    python_m("nat_kd.generate_distilled", *args, "--out", whole)
    killed = tmp_path / "killed"
    kill_after_first_chunk_and_resume([sys.executable, "-m", "nat_kd.generate_distilled", *args, "--out", str(killed)],
                                      killed)
    assert output_bytes(killed) == output_bytes(whole)


def test_settings_that_do_not_fit_are_refused(teachers, tiny_en_de, tmp_path):
    def run(name, **kw):
        distill(published(teachers, name, tiny_en_de, tmp_path / "x", **kw))

    with pytest.raises(SettingsError, match=r"multilingual: give --teacher-src-lang and --teacher-tgt-lang"):
        distill(DistillConfig(teachers=[str(teachers["m2m100"])], out_dir=str(tmp_path / "y"),
                              source=str(tiny_en_de / "raw" / "valid.en"), reference=str(tiny_en_de / "raw" / "valid.de"),
                              ct2_cache=str(tmp_path / "cache")))
    with pytest.raises(SettingsError, match=r"--teacher-tgt-lang xx: not a language code of teacher .*; give one of "
                                            r"its tokenizer's 100 codes: af, am, ar"):
        run("m2m100", teacher_tgt_lang="xx")
    with pytest.raises(SettingsError, match=r"--teacher-tgt-lang xx: neither __xx__ nor a language token xx is in"):
        run("m2m100-ct2", teacher_tgt_lang="xx")
    with pytest.raises(SettingsError, match=r"translates one language pair: drop --teacher-src-lang"):
        run("marian", teacher_src_lang="en", teacher_tgt_lang="de")
    with pytest.raises(SettingsError, match=r"drop --backend fairseq"):
        run("marian", backend="fairseq")
    with pytest.raises(SettingsError, match=r"compares searches, not samples"):
        run("marian", strategy="sampling", check_against_transformers=5)
    with pytest.raises(SettingsError, match=r"--check-against-transformers needs a Hugging Face teacher"):
        run("ct2", check_against_transformers=5)
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(SettingsError, match=r"model_type 'bert' is not supported; supported: marian"):
        distill(published({"odd": tmp_path / "odd"}, "odd", tiny_en_de, tmp_path / "z"))
    assert not any((tmp_path / n).exists() for n in "xyz")


def test_tracebacks_are_one_line_errors_naming_the_fix(teachers, tiny_en_de, tmp_path, capsys):
    """Exit status 2 and one line that names the fix: a Hugging Face folder with the weights alone (no
    tokenizer files); a language code that is a plain piece of the vocabulary (a), in a Hugging Face and in a
    CTranslate2 folder."""
    from nat_kd.generate_distilled import main

    weights = tmp_path / "weights-only"
    weights.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(teachers["marian"] / name, weights)

    def error(folder, *codes) -> str:
        code = main(["--teacher-path", str(folder), *codes, "--prepared", str(tiny_en_de), "--split", "valid",
                     "--ct2-cache", str(tmp_path / "cache"), "--out", str(tmp_path / "o"), "--no-progress-bar"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        return err.strip().splitlines()[-1]

    assert error(weights) == (f"error: teacher {weights} has the model's weights but none of its tokenizer's files "
                              "(source.spm, target.spm, vocab.json): copy them into the folder from where the model "
                              "came from (tokenizer.save_pretrained(FOLDER) writes them)")
    languages = ("--teacher-src-lang", "a", "--teacher-tgt-lang", "de")
    assert error(teachers["m2m100"], *languages) == (
        f"error: --teacher-src-lang a: not a language code of teacher {teachers['m2m100']} (a is a piece of its "
        "vocabulary, not a language); give one of its tokenizer's 100 codes: af, am, ar, ast, az, ba, be, bg, ...")
    assert error(teachers["m2m100-ct2"], *languages) == (
        f"error: --teacher-src-lang a: neither __a__ nor a language token a is in the vocabulary of teacher "
        f"{teachers['m2m100-ct2']} (a is a piece of its sentencepiece model, not a language); give one of its "
        "language codes")
    assert not (tmp_path / "o").exists()


def test_ctranslate2_model_with_fewer_positions(teachers, tiny_en_de, tmp_path, monkeypatch):
    """A converted MarianMT with 64 positions, fewer than the 512 a CTranslate2 folder was taken to have: its
    model.bin records them, so the generator cuts the sources and outputs there (as for a Hugging Face folder's
    max_position_embeddings) instead of CTranslate2 failing mid-run. Where the folder did not record them,
    CTranslate2's error becomes the --max-len-b to pass."""
    from ctranslate2.converters import TransformersConverter

    from nat_kd.distill import teachers as published_teachers

    hf, folder = tmp_path / "marian64", tmp_path / "marian64-ct2"
    shutil.copytree(teachers["marian"], hf)
    config = transformers.MarianConfig.from_pretrained(str(hf))
    transformers.MarianMTModel(tiny(transformers.MarianConfig, config.vocab_size, positions=64, **{
        k: getattr(config, k) for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id",
                                        "forced_eos_token_id")})).save_pretrained(hf)
    TransformersConverter(str(hf)).convert(str(folder))
    for name in ("source.spm", "target.spm"):
        shutil.copy(hf / name, folder)

    result = distill(published({"ct2": folder}, "ct2", tiny_en_de, tmp_path / "o", strategy="greedy",
                               max_len_b=200))
    assert result.meta["teacher"]["max_positions"] == [64, 64]
    lengths = [len(line.split()) for line in lines(result.out_dir / "spm" / "train.de")]
    assert max(lengths) == 63  # the random teacher runs on to the limit: 63 tokens and EOS
    assert result.meta["truncated_source_lines"]
    monkeypatch.setattr(published_teachers, "model_positions", lambda model_bin: None)
    with pytest.raises(SettingsError, match=r"has 64 positions \(CTranslate2: No position encodings are defined "
                                            r"for positions >= 64.*\): pass --max-len-b 63 or less, and cut sources "
                                            r"longer than 64 tokens"):
        distill(published({"ct2": folder}, "ct2", tiny_en_de, tmp_path / "p", strategy="greedy", max_len_b=200))


@pytest.mark.slow
def test_worker_processes_keep_fairseqs_info_lines_quiet(teachers, tiny_en_de, tmp_path):
    """--workers 2: each spawned worker imports fairseq, which logs "Please install tensorboardX" as it is
    imported; like the main process, the workers show none of fairseq's INFO lines."""
    command = [sys.executable, "-m", "nat_kd.generate_distilled", "--teacher-path", str(teachers["marian"]),
               "--prepared", str(tiny_en_de), "--split", "train", "--strategy", "greedy",
               "--max-len-b", str(MAX_LEN), "--chunk-sentences", "50", "--workers", "2", "--threads", "1",
               "--ct2-cache", str(tmp_path / "cache"), "--out", str(tmp_path / "o"), "--no-progress-bar"]
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "2 worker(s)" in proc.stdout and len(lines(tmp_path / "o" / "train.de")) == TRAIN_LINES
    assert "tensorboardX" not in proc.stdout and "INFO:" not in proc.stdout, proc.stdout
