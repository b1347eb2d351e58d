"""Data preparation: outputs, the content-hash cache, the mixed corpus and clear errors on bad input."""
import gzip
import json

import pytest

from nat_kd.corpus import CorpusError, data_dir, read_lines
from nat_kd.errors import SettingsError
from nat_kd.prepare import PrepareConfig, main, prepare

LINES = {"train": 40, "val": 12, "test_2016_flickr": 10}


@pytest.fixture
def raw_dir(tmp_path):
    """A small copy of the real corpus: the first lines of every split and language, gzipped as shipped."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in LINES.items():
        for lang in ("en", "de", "fr", "cs"):
            lines = read_lines(data_dir() / f"{split}.{lang}.gz")[:n]
            with gzip.open(raw / f"{split}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))
    return raw


def small(tgt="de", vocab=120):
    return PrepareConfig("en", tgt, vocab_size=vocab)


def test_outputs_are_line_aligned_and_binarized(raw_dir, tmp_path):
    out = prepare(small(), raw_dir, tmp_path / "out")
    assert read_lines(out / "raw" / "train.de") == read_lines(raw_dir / "train.de.gz")
    assert len(read_lines(out / "spm" / "valid.en")) == LINES["val"]
    # each split's binarized lines are its sentencepiece pieces, token for token, ending with </s>
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(out / "bin" / "dict.de.txt"))
    for split, lang in (("train", "en"), ("valid", "de"), ("test", "en")):
        pieces = read_lines(out / "spm" / f"{split}.{lang}")
        binarized = data_utils.load_indexed_dataset(str(out / "bin" / f"{split}.en-de.{lang}"), dictionary)
        assert len(binarized) == len(pieces)
        assert [dictionary.string(binarized[i]) for i in range(len(pieces))] == pieces
        assert all(binarized[i][-1] == dictionary.eos() for i in range(len(pieces)))
    # one joined dictionary: the source and target dictionaries are the same file content
    assert (out / "bin" / "dict.en.txt").read_text() == (out / "bin" / "dict.de.txt").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sentences"] == {"train": 40, "valid": 12, "test": 10}


def test_the_same_corpus_read_from_another_folder_gives_the_same_manifest_byte_for_byte(raw_dir, tmp_path):
    """A study takes manifest.json's digest as the corpus's: where the corpus was read from goes to source.json
    only, so a store's records match on another machine; a manifest that named its folder is rebuilt."""
    import shutil

    moved = tmp_path / "elsewhere" / "multi30k"
    shutil.copytree(raw_dir, moved)
    first, second = prepare(small(), raw_dir, tmp_path / "a"), prepare(small(), moved, tmp_path / "b")
    assert (first / "manifest.json").read_bytes() == (second / "manifest.json").read_bytes()
    assert str(raw_dir) not in (first / "manifest.json").read_text()
    assert json.loads((second / "source.json").read_text()) == {"raw_dir": str(moved)}
    manifest = json.loads((first / "manifest.json").read_text())
    (first / "manifest.json").write_text(json.dumps({**manifest, "raw_dir": str(raw_dir)}))
    prepare(small(), raw_dir, first)
    assert (first / "manifest.json").read_bytes() == (second / "manifest.json").read_bytes()


def test_rerun_is_a_noop_and_changes_rebuild(raw_dir, tmp_path, caplog):
    out = prepare(small(), raw_dir, tmp_path / "out")
    manifest = out / "manifest.json"
    first = manifest.stat().st_mtime_ns
    caplog.set_level("INFO")
    prepare(small(), raw_dir, out)
    assert manifest.stat().st_mtime_ns == first
    assert "up to date" in caplog.text

    prepare(small(vocab=110), raw_dir, out)  # a changed setting rebuilds
    second = json.loads(manifest.read_text())
    assert second["config"]["vocab_size"] == 110

    lines = read_lines(raw_dir / "train.de.gz")
    lines[3] = "Ein ganz anderer Satz ."
    with gzip.open(raw_dir / "train.de.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    prepare(small(vocab=110), raw_dir, out)  # a changed input rebuilds
    assert json.loads(manifest.read_text())["fingerprint"] != second["fingerprint"]
    assert read_lines(out / "raw" / "train.de")[3] == "Ein ganz anderer Satz ."


def test_mixed_multi_target_corpus(raw_dir, tmp_path):
    out = prepare(small(tgt="mix", vocab=200), raw_dir, tmp_path / "mix")
    sources, targets = read_lines(out / "raw" / "train.en"), read_lines(out / "raw" / "train.mix")
    langs = read_lines(out / "train.lang")
    assert len(sources) == len(targets) == len(langs) == 3 * LINES["train"]
    assert langs[:6] == ["de", "fr", "cs", "de", "fr", "cs"]
    english = read_lines(raw_dir / "train.en.gz")
    assert sources[3:6] == [english[1]] * 3  # the same English sentence, three targets, no language tag
    assert targets[4] == read_lines(raw_dir / "train.fr.gz")[1]
    assert (out / "bin" / "train.en-mix.mix.bin").is_file()


def test_missing_data_directory(tmp_path):
    with pytest.raises(CorpusError, match=r"nowhere.*does not exist.*NAT_KD_DATA"):
        prepare(small(), tmp_path / "nowhere", tmp_path / "out")


def test_line_count_mismatch_names_file_and_counts(raw_dir, tmp_path):
    lines = read_lines(raw_dir / "val.de.gz")[:-2]
    with gzip.open(raw_dir / "val.de.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    with pytest.raises(CorpusError, match=r"val\.en\.gz has 12 lines but .*val\.de\.gz has 10"):
        prepare(small(), raw_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("src,tgt", [("en", "xx"), ("en", "en"), ("mix", "de")])
def test_unknown_language_pair(src, tgt):
    with pytest.raises(CorpusError, match="unknown language pair"):
        PrepareConfig(src, tgt)


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    assert main(["--src", "en", "--tgt", "jp", "--data-dir", str(tmp_path)]) == 2
    assert "unknown language pair en-jp" in capsys.readouterr().err


def test_out_dir_that_holds_inputs_or_other_files_is_refused_before_any_work(raw_dir, tmp_path, capsys):
    """Preparing replaces --out-dir whole: a folder holding the user's own files, or a plain file, is refused
    (exit 2, one line) and left as it was; an earlier prepared corpus is replaced as before."""
    own = tmp_path / "own" / "en-de"
    own.mkdir(parents=True)
    for lang in ("en", "de"):
        (own / f"train.{lang}").write_text("".join(line + "\n" for line in read_lines(raw_dir / f"train.{lang}.gz")))
    (own / "notes.txt").write_text("mine")
    before = {path.name: path.read_bytes() for path in own.iterdir()}
    own_corpus = ["--src", "en", "--tgt", "de", "--trainpref", str(own / "train"), "--vocab-size", "120"]

    assert main([*own_corpus, "--out-dir", str(own)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is or holds the input" in err and "choose another --out-dir" in err
    assert main([*own_corpus, "--out-dir", str(own / "train.en")]) == 2
    assert "is or holds the input" in capsys.readouterr().err

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main([*own_corpus, "--out-dir", str(other)]) == 2
    assert "exists and is not a prepared corpus (no manifest.json)" in capsys.readouterr().err
    plain = tmp_path / "plain"
    plain.write_text("mine")
    assert main([*own_corpus, "--out-dir", str(plain)]) == 2
    assert f"{plain} is a file, not a folder" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in own.iterdir()} == before
    assert (other / "notes.txt").read_text() == plain.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "own", "plain", "raw"]  # nothing begun

    # an earlier prepared corpus is replaced, unless it holds the input itself
    out = prepare(small(), raw_dir, tmp_path / "out")
    assert main([*own_corpus, "--out-dir", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["config"]["trainpref"] is True
    assert json.loads((out / "source.json").read_text())["trainpref"] == str(own / "train")
    with pytest.raises(SettingsError, match="is or holds the input"):
        prepare(PrepareConfig("en", "de", vocab_size=120, trainpref=str(out / "raw" / "train")), out_dir=out)


def test_out_dir_may_be_the_current_folder(raw_dir, tmp_path, monkeypatch, capsys):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["--data-dir", str(raw_dir), "--vocab-size", "120", "--out-dir", "."]) == 0
    assert capsys.readouterr().out.strip() == str(here)
    assert (here / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "raw"]  # no temporary folder left


@pytest.mark.slow
def test_an_own_corpus_with_a_model_is_prepared_line_by_line(raw_dir, tmp_path):
    """With --spm-model (or --bpe-codes, --pretokenized) the text is not held: 12 times the lines raise the peak
    of Python's allocations by less than the added text's size (fairseq's binarizer keeps a few numbers per
    line: about a quarter of it; holding the lines, their pieces and the joined files took about 8 times)."""
    import tracemalloc

    model = prepare(small(), raw_dir, tmp_path / "model") / "spm.model"
    english, german = read_lines(raw_dir / "train.en.gz"), read_lines(raw_dir / "train.de.gz")

    def peak_and_size(n: int) -> tuple[int, int]:
        corpus = tmp_path / f"c{n}"
        for lang, lines in (("en", english), ("de", german)):
            corpus.with_suffix(f".{lang}").write_text("".join(lines[i % len(lines)] + "\n" for i in range(n)))
        cfg = PrepareConfig("en", "de", trainpref=str(corpus), spm_model=str(model))
        tracemalloc.start()
        try:
            out = prepare(cfg, out_dir=tmp_path / f"out{n}", workers=1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(read_lines(out / "spm" / "train.de")) == n
        return peak, sum(corpus.with_suffix(f".{lang}").stat().st_size for lang in ("en", "de"))

    peak_and_size(100)  # the first run's imports are not the corpus's
    small_peak, small_size = peak_and_size(500)
    large_peak, large_size = peak_and_size(6000)
    assert large_peak - small_peak < large_size - small_size


def test_crlf_ends_a_line_but_a_carriage_return_inside_one_is_an_error(raw_dir, tmp_path, capsys):
    """fairseq-preprocess reads with universal newlines: a lone \\r would split a line there and shift every later
    pair in bin/, so it is refused before anything is written."""
    english, german = (read_lines(raw_dir / f"train.{lang}.gz")[:5] for lang in ("en", "de"))
    own = tmp_path / "own"
    own.mkdir()
    (own / "train.en").write_bytes("".join(line + "\r\n" for line in english).encode())
    assert read_lines(own / "train.en") == english  # Windows line ends are line ends
    german[2] = "Ein kleines Mädchen klettert\rin ein Spielhaus aus Holz."
    (own / "train.de").write_bytes("".join(line + "\n" for line in german).encode())
    out = tmp_path / "out"
    assert main(["--src", "en", "--tgt", "de", "--trainpref", str(own / "train"), "--pretokenized",
                 "--out-dir", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{own / 'train.de'}:3: a carriage return (\\r) inside the line" in err and "tr -d '\\r'" in err
    assert not out.exists()


def test_missing_own_corpus_file_names_the_prefix_option(raw_dir, tmp_path, capsys):
    """A file of an own corpus is found by its prefix option, not by --data-dir (which does not apply)."""
    own = tmp_path / "own"
    own.mkdir()
    for lang in ("en", "de"):
        (own / f"train.{lang}").write_text("".join(line + "\n" for line in read_lines(raw_dir / f"train.{lang}.gz")),
                                           encoding="utf-8")
    (own / "dev.en").mkdir()  # a folder where a file should be
    common = ["--src", "en", "--tgt", "de", "--out-dir", str(tmp_path / "out"), "--workers", "1"]
    assert main(["--trainpref", str(own / "nonexist"), *common]) == 2
    assert capsys.readouterr().err == (f"error: no {own / 'nonexist.en.gz'} or {own / 'nonexist.en'}; check "
                                       "--trainpref and the language pair\n")
    assert main(["--trainpref", str(own / "train"), "--validpref", str(own / "dev"), *common]) == 2
    assert capsys.readouterr().err == f"error: {own / 'dev.en'} is not a file (a folder?); check --validpref\n"
    assert not (tmp_path / "out").exists()


def test_the_same_prepared_corpus_whatever_the_workers(raw_dir, tmp_path):
    """sentencepiece trains with the same threads whatever --workers (its pieces change with its thread count),
    and fairseq-preprocess's workers split the binarizing alone."""
    import sentencepiece as spm

    one, three = (prepare(small(), raw_dir, tmp_path / f"w{n}", workers=n) for n in (1, 3))

    def pieces(out):
        model = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
        return [(model.id_to_piece(i), model.get_score(i)) for i in range(model.get_piece_size())]

    assert pieces(one) == pieces(three)
    def binarized(out):  # preprocess.log aside, which names the workers
        return {p.name: p.read_bytes() for p in (out / "bin").iterdir() if p.name != "preprocess.log"}

    assert len(binarized(one)) == 14 and binarized(one) == binarized(three)
