"""The on-disk artefacts' types name the files nat_kd.prepare writes (the distilled set: tests/test_generate.py)."""
from pathlib import Path

import pytest

from nat_kd.artifacts import PreparedCorpus
from nat_kd.corpus import CorpusError


def test_prepared_corpus_names_what_prepare_writes(tiny_en_de):
    prepared = PreparedCorpus(tiny_en_de)
    assert prepared.language_pair() == ("en", "de")
    assert prepared.manifest()["sentences"]["train"] == 203
    assert prepared.spm_model.is_file() and prepared.spm_model.with_suffix(".vocab").is_file()
    named = {prepared.manifest_file, prepared.source_file, prepared.spm_model, prepared.spm_model.with_suffix(".vocab"),
             prepared.bin.dictionary("en"), prepared.bin.dictionary("de"), prepared.bin.root / "preprocess.log"}
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            named |= {prepared.raw(split, lang), prepared.pieces(split, lang),
                      *(Path(f"{prepared.bin.prefix(split, 'en', 'de', lang)}{ext}") for ext in (".bin", ".idx"))}
    assert {p for p in prepared.root.rglob("*") if p.is_file()} == named  # nothing unnamed, nothing missing
    assert prepared.bin.split_files("en", "de") == sorted(p for p in named if p.suffix in (".bin", ".idx"))
    assert prepared.pieces_prefix("train").with_name("train.de") == prepared.pieces("train", "de")


def test_a_folder_that_is_not_a_prepared_corpus_is_named(tmp_path):
    with pytest.raises(CorpusError, match=r"no manifest.json naming its languages; is it nat_kd.prepare output"):
        PreparedCorpus(tmp_path).language_pair()
    (tmp_path / "manifest.json").write_text('{"config": {"src": "en",\n oops}')
    with pytest.raises(CorpusError, match=r"manifest.json:2: invalid JSON"):
        PreparedCorpus(tmp_path).language_pair()
