"""The ``nat_kd.analyze`` command line: outputs, the report contract, and bad input."""
import gzip
import json
import math

import pytest

from nat_kd.analysis.metrics import align_corpus
from nat_kd.analysis.tokenizers import get_tokenizer
from nat_kd.analyze import main

EN = ["A man rides a horse .", "A woman reads a book .", "Two dogs play .", "A man reads ."]
DE = ["Ein Mann reitet ein Pferd .", "Eine Frau liest ein Buch .", "Zwei Hunde spielen .", "Ein Mann liest ."]


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "train.en").write_text("\n".join(EN) + "\n")
    with gzip.open(tmp_path / "train.de.gz", "wt") as out:
        out.write("\n".join(DE) + "\n")
    return tmp_path


def test_align_writes_pharaoh_and_table(corpus, capsys):
    assert main(["align", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.de.gz"), "-d", "-o", "-v",
                 "--alignments", str(corpus / "out.align"), "-p", str(corpus / "out.table")]) == 0
    links = (corpus / "out.align").read_text().splitlines()
    assert len(links) == 4 and links[2] == "0-0 1-1 2-2 3-3"
    rows = [line.split("\t") for line in (corpus / "out.table").read_text().splitlines()]
    assert rows and all(len(r) == 3 and float(r[2]) <= 0 for r in rows)
    assert rows[0][0] == "<eps>"
    assert "aligner': 'builtin(I5|d|o|v" in capsys.readouterr().err


def test_fast_align_input_format(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a b ||| x y\nb ||| y\n")
    assert main(["align", "-i", str(tmp_path / "c.txt"), "-d"]) == 0
    assert capsys.readouterr().out == "0-0 1-1\n0-0\n"


def test_fast_align_input_refuses_the_options_it_would_ignore(tmp_path, capsys):
    """-i is read as tokenised text: a tokeniser, a sentencepiece model or text files given beside it would be
    silently unused (the table computed with another tokenisation than the user asked for), so each is an error."""
    pairs = tmp_path / "c.txt"
    pairs.write_text("".join(f"{s.lower()} ||| {t.lower()}\n" for s, t in zip(EN, DE)))
    assert main(["complexity", "-i", str(pairs)]) == 0
    capsys.readouterr()
    for extra, named in [(["--tok", "13a"], "--tok"), (["--tok", "spm", "--spm-model", "m.model"], "--tok and --spm-model"),
                         (["--src", "train.en"], "--src")]:
        assert main(["complexity", "-i", str(pairs), *extra]) == 2
        assert capsys.readouterr().err == (
            f"error: -i {pairs} is already tokenised text (fast_align's 'src ||| tgt', read as --tok none): drop "
            f"{named}, or pass --src and --tgt instead of -i\n")


def test_complexity_from_text_and_from_table(corpus, capsys):
    assert main(["align", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.de.gz"), "-d", "-o", "-v",
                 "--alignments", str(corpus / "a"), "-p", str(corpus / "t")]) == 0
    assert main(["complexity", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.de.gz"),
                 "--json", str(corpus / "c.json")]) == 0
    from_text = json.loads((corpus / "c.json").read_text())["score"]
    assert main(["complexity", "--table", str(corpus / "t"), "--json", str(corpus / "c2.json")]) == 0
    assert json.loads((corpus / "c2.json").read_text())["score"] == pytest.approx(from_text, abs=1e-5)
    assert "C(d) =" in capsys.readouterr().out


def test_byte_order_mark_is_not_a_word(tmp_path, capsys):
    """A UTF-8 byte order mark (as Windows editors write it) is dropped: the same complexity, over the same 706
    source words, as the file without it (the real first 200 pairs of Multi30k en-de)."""
    from nat_kd.corpus import data_dir, read_lines

    for lang in ("en", "de"):
        text = "".join(line + "\n" for line in read_lines(data_dir() / f"train.{lang}.gz")[:200])
        (tmp_path / f"plain.{lang}").write_text(text, encoding="utf-8")
        (tmp_path / f"bom.{lang}").write_text(text, encoding="utf-8-sig")
    assert read_lines(tmp_path / "bom.en")[0] == "Two young, White males are outside near many bushes."
    for name in ("plain", "bom"):
        assert main(["complexity", "--src", str(tmp_path / f"{name}.en"), "--tgt", str(tmp_path / f"{name}.de"),
                     "--json", str(tmp_path / f"{name}.json")]) == 0
    plain, bom = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("plain", "bom"))
    assert bom == plain and bom["vocab_size"] == 706


def test_report_contract(corpus, capsys):
    kd = corpus / "kd"
    kd.mkdir()
    (kd / "train.en").write_text("\n".join(EN) + "\n")
    (kd / "train.de").write_text("Ein Mann reitet ein Pferd .\nEine Frau liest ein Buch .\nZwei Hunde .\n"
                                 "Ein Mann liest .\n")
    (kd / "meta.json").write_text(json.dumps({"name": "kd-beam5", "strategy": "beam"}))
    out = corpus / "report"
    assert main(["report", "--data-dir", str(corpus), "--set-dir", str(kd),
                 "--set", f"copy={corpus / 'train.en'},{corpus / 'train.de.gz'}",
                 "--lang", f"en={corpus / 'train.en'}", "--lang", f"de={corpus / 'train.de.gz'}", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["real", "copy", "kd-beam5"]
    assert rows["real"]["faithfulness"] == 0 and rows["real"]["bleu"] == pytest.approx(100)
    assert rows["copy"]["complexity"] == pytest.approx(rows["real"]["complexity"])
    assert rows["kd-beam5"]["strategy"] == "beam" and rows["kd-beam5"]["faithfulness"] > 0
    assert rows["kd-beam5"]["missing_words"] == 0 and rows["real"]["missing_words"] == 0
    assert rows["kd-beam5"]["length_ratio"] == pytest.approx(19 / 20)  # 13a tokens: one word fewer
    assert rows["real"]["mode_mix"]["de"] > 0.5
    assert report["signature"]["tok"] == "13a" and "nrefs:1" in report["signature"]["bleu"]
    assert (out / "complexity_vs_faithfulness.png").stat().st_size > 1000
    assert (out / "mode_mix.png").exists()
    assert "| kd-beam5 | beam |" in (out / "report.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left behind
    # the frequency buckets: the real source words are a, man, rides, horse, ., woman, reads, book, two, dogs,
    # play: "a" 5 times, "man" "reads" "." 2-4 times, the 7 others once
    assert [(b["bucket"], b["words"]) for b in rows["real"]["frequency_buckets"]] == [
        ("1", 7), ("2-4", 3), ("5-19", 1), ("20+", 0)]
    assert all(b["kept"] == 1.0 for b in rows["copy"]["frequency_buckets"] if b["real_pairs"])
    assert "| kd-beam5 | 1 | 7 |" in (out / "report.md").read_text()
    # the first table's count is the frequency table's last column summed, under the same name
    for row in rows.values():
        assert row["words_losing_all"] == sum(b["words_losing_all"] for b in row["frequency_buckets"])
    assert rows["real"]["words_losing_all"] == 0 < rows["kd-beam5"]["words_losing_all"]
    first_table = (out / "report.md").read_text().split("\n\n", 1)[0]
    assert "words losing every translation" in first_table and "words lost" not in first_table
    kd_line = next(line for line in first_table.splitlines() if line.startswith("| kd-beam5 |"))
    assert f"| {rows['kd-beam5']['words_losing_all']} |" in kd_line
    assert not (kd / "CARD.md").exists()  # a folder the generator did not write gets no card


def test_sentences_scores_any_pair_of_files(corpus, capsys):
    hyp = corpus / "hyp.de"
    hyp.write_text("Ein Mann reitet ein Pferd .\nEine Frau liest ein Buch Buch .\nZwei Hunde .\nEin Mann liest .\n")
    out = corpus / "scores.tsv"
    assert main(["sentences", "--hyp", str(hyp), "--ref", str(corpus / "train.de.gz"),
                 "--src", str(corpus / "train.en"), "--out", str(out)]) == 0
    assert main(["reordering", "--src", str(corpus / "train.en"), "--tgt", str(hyp), "--per-sentence",
                 str(corpus / "frs.txt")]) == 0
    header, *rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert header == ["line", "bleu", "chrf", "length_ratio", "repeated_ngrams", "repeated", "frs"]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert float(rows[0][1]) == 100.0 and float(rows[3][2]) == 100.0
    # line 2 has one word more than its reference (7 / 6); line 3 one fewer (3 / 4)
    assert [float(r[3]) for r in rows] == pytest.approx([1.0, 7 / 6, 0.75, 1.0], abs=1e-5)  # 6 digits written
    assert [r[4] for r in rows] == ["0", "0", "0", "0"]  # "buch buch" repeats a word, not a bigram
    assert [float(r[6]) for r in rows] == pytest.approx([float(x) for x in (corpus / "frs.txt").read_text().split()],
                                                         nan_ok=True)
    assert "bleu: mean" in capsys.readouterr().out


@pytest.mark.slow
def test_sentences_scores_a_block_at_a_time(tmp_path, monkeypatch):
    """2,000 real lines in blocks of 300 (the last one short): the file that scoring every line at once writes,
    FRS included, while memory holds one block's text and sacrebleu statistics (holding all of them, 29,000
    lines peaked at 862 MB)."""
    import tracemalloc

    from nat_kd.analysis.metrics import sentence
    from nat_kd.analysis.metrics.reordering import line_scores
    from nat_kd.corpus import data_dir, read_lines

    english, german = (read_lines(data_dir() / f"train.{lang}.gz")[:2001] for lang in ("en", "de"))
    files = {"src": (tmp_path / "src.en", english[:2000]), "hyp": (tmp_path / "hyp.de", german[:2000]),
             "ref": (tmp_path / "ref.de", german[1:])}  # each line scored against the next one's translation
    for path, lines in files.values():
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    aligned = align_corpus(english[:2000], german[:2000], get_tokenizer("13a", lowercase=True))
    sentence.SentenceScorer().score(german[:2000], german[1:]).with_column("frs", line_scores(aligned)).write(
        tmp_path / "expected.tsv")
    monkeypatch.setattr(sentence, "SCORE_BLOCK", 300, raising=False)
    args = ["sentences", *(f"--{name}={path}" for name, (path, _) in files.items())]
    assert main([*args, "--out", str(tmp_path / "scores.tsv")]) == 0
    assert (tmp_path / "scores.tsv").read_bytes() == (tmp_path / "expected.tsv").read_bytes()
    tracemalloc.start()
    try:
        assert main([*args[:1], *args[2:], "--out", str(tmp_path / "no_frs.tsv")]) == 0  # without --src
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20e6  # 10 MB; 50 MB when every line's statistics were held


def test_report_finds_a_set_whatever_its_split(corpus, capsys):
    """A set distilled from another split (here valid.*, as meta.json names them) needs no --split; a folder
    without meta.json holding one split is found too, and one holding two asks for --split."""
    named, bare = corpus / "named", corpus / "bare"
    for folder in (named, bare):
        folder.mkdir()
        (folder / "valid.en").write_text("\n".join(EN) + "\n")
        (folder / "valid.de").write_text("\n".join(DE[:3]) + "\nEin Mann .\n")
    (named / "meta.json").write_text(json.dumps({"name": "kd", "strategy": "beam", "split": "valid",
                                                 "files": {"source": "valid.en", "target": "valid.de"}}))
    real = ["--real-src", str(corpus / "train.en"), "--real-tgt", str(corpus / "train.de.gz")]
    assert main(["report", *real, "--set-dir", str(named), "--set-dir", str(bare), "--out", str(corpus / "r")]) == 0
    rows = {r["name"]: r for r in json.loads((corpus / "r" / "report.json").read_text())["rows"]}
    assert rows["kd"]["strategy"] == "beam" and rows["kd"]["bleu"] == rows["bare"]["bleu"] < 100
    (bare / "test.en").write_text("\n".join(EN) + "\n")
    (bare / "test.de").write_text("\n".join(DE) + "\n")
    err = run_error(["report", *real, "--set-dir", str(bare), "--out", str(corpus / "r2")], capsys)
    assert "2 splits with both .en and .de files (test, valid); pass --split" in err


# ---------------------------------------------------------------- bad input

def run_error(argv, capsys):
    assert main(argv) == 2
    return capsys.readouterr().err


def test_line_count_mismatch_names_both_files(corpus, capsys):
    (corpus / "short.de").write_text("Ein Mann .\n")
    err = run_error(["complexity", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "short.de")], capsys)
    assert "train.en has 4 lines" in err and "short.de has 1" in err


def test_empty_line_names_file_and_line(corpus, capsys):
    (corpus / "gap.de").write_text("Ein Mann .\n\nZwei .\nVier .\n")
    err = run_error(["reordering", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "gap.de")], capsys)
    assert "gap.de:2: empty line" in err and "--drop-empty" in err
    assert main(["reordering", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "gap.de"), "--drop-empty"]) == 0


def test_separator_inside_sentence(corpus, capsys):
    # 13a splits '|||' into '| | |'; pre-tokenised text keeps it, and fast_align would cut the line there
    (corpus / "pipe.de").write_text("Ein ||| Mann .\nB .\nC .\nD .\n")
    err = run_error(["complexity", "--tok", "none", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "pipe.de")],
                    capsys)
    assert "pipe.de:1:" in err and "'|||'" in err


def test_invalid_utf8_names_file_and_line(corpus, capsys):
    (corpus / "bad.de").write_bytes(b"Ein Mann .\nEine \xff Frau .\nC .\nD .\n")
    err = run_error(["complexity", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "bad.de")], capsys)
    assert "bad.de:2: invalid UTF-8" in err


def test_malformed_table_names_file_and_line(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("a\tx\t-0.5\na x -0.5\n")
    err = run_error(["complexity", "--table", str(tmp_path / "t.txt")], capsys)
    assert "t.txt:2: malformed table line" in err


def test_fast_align_aligner_runs_the_binary(corpus, tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "fast_align"
    exe.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -p ] && printf 'a\\tx\\t-0.5\\na\\ty\\t-0.9\\n' > \"$2\"; "
                   "shift; done\nprintf '0-0\\n0-0\\n0-0\\n0-0\\n'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert main(["complexity", "--aligner", "fast_align", "--src", str(corpus / "train.en"),
                 "--tgt", str(corpus / "train.de.gz"), "--json", str(tmp_path / "c.json")]) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    p = [math.exp(-0.5), math.exp(-0.9)]
    p = [x / sum(p) for x in p]
    assert result["score"] == pytest.approx(-sum(x * math.log(x) for x in p), rel=1e-6)
    assert "aligner:fast_align(" in result["signature"]


def test_tension_flag_implies_favour_diagonal(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a b ||| x y\n")
    assert main(["align", "-i", str(tmp_path / "c.txt"), "-T", "2.5"]) == 0
    assert "builtin(I5|d|a0.01|T2.5" in capsys.readouterr().err


def test_tokenisers(tmp_path):
    import sentencepiece

    from nat_kd.analysis.tokenizers import get_tokenizer

    assert get_tokenizer("13a", lowercase=True)("A man, a plan.") == "a man , a plan ."
    assert get_tokenizer("none")("  a  b\tc ") == "a b c"
    text = tmp_path / "text.txt"
    text.write_text("\n".join(EN * 20) + "\n")
    sentencepiece.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "m"), vocab_size=25,
                                             minloglevel=2)
    spm = get_tokenizer("spm", spm_model=str(tmp_path / "m.model"))
    assert spm("A man reads .").replace(" ", "").replace("\u2581", "") == "Amanreads."
    assert spm.settings == {"tok": "spm(m.model)", "lc": "no"}
    with pytest.raises(ValueError, match="--spm-model"):
        get_tokenizer("spm")


def test_many_shards_give_the_same_outputs(corpus, monkeypatch):
    """A corpus too big for one shard (here: 10 links a shard) is spilled to disk and streamed; every output
    must be the one-shard run's."""
    import nat_kd.analysis.align

    def run(tag):
        out = corpus / tag
        args = ["--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.de.gz")]
        assert main(["align", *args, "-d", "-o", "-v", "--alignments", str(out / "links"), "-p", str(out / "table"),
                     "--log", str(out / "log")]) == 0
        assert main(["reordering", *args, "--per-sentence", str(out / "frs"), "--json", str(out / "frs.json")]) == 0
        assert main(["report", "--data-dir", str(corpus), "--set", f"copy={corpus / 'train.en'},{corpus / 'train.de.gz'}",
                     "--out", str(out / "report")]) == 0
        return {name: (out / name).read_text() for name in ("links", "table", "log", "frs", "frs.json")}, \
            json.loads((out / "report" / "report.json").read_text())["rows"]

    whole, whole_rows = run("whole")
    monkeypatch.setattr(nat_kd.analysis.align, "SHARD_LINKS", 10)
    sharded, sharded_rows = run("sharded")
    assert sharded == whole and sharded_rows == whole_rows
    assert whole["links"].splitlines()[2] == "0-0 1-1 2-2 3-3"
    assert "final tension" in whole["log"]


def test_report_bleu_is_sacrebleus_corpus_score(corpus):
    import sacrebleu

    (corpus / "hyp.de").write_text("Ein Mann reitet .\nEine Frau liest ein Buch .\nZwei Hunde spielen .\nEin Mann .\n")
    assert main(["report", "--data-dir", str(corpus), "--set", f"hyp={corpus / 'train.en'},{corpus / 'hyp.de'}",
                 "--out", str(corpus / "r")]) == 0
    row = json.loads((corpus / "r" / "report.json").read_text())["rows"][1]
    expected = sacrebleu.BLEU(lowercase=True).corpus_score((corpus / "hyp.de").read_text().splitlines(), [DE])
    assert row["bleu"] == expected.score and 0 < row["bleu"] < 100
    assert row["length_ratio"] == expected.sys_len / expected.ref_len


def test_report_needs_both_real_sides_or_neither(tmp_path, capsys):
    """One side of the real data alone is not silently replaced by the default Multi30k pair: an error before
    any work."""
    from nat_kd.corpus import data_dir

    out = tmp_path / "report"
    for given, missing in (("src", "tgt"), ("tgt", "src")):
        lang = "en" if given == "src" else "de"
        assert main(["report", f"--real-{given}", str(data_dir() / f"val.{lang}.gz"), "--set-dir",
                     str(tmp_path / "kd"), "--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"error: --real-{given} needs --real-{missing}: pass both, or neither "
                                           "for the Multi30k data in --data-dir\n")
    assert not out.exists()


def test_spm_model_without_tok_spm_is_an_error_not_ignored(tiny_en_de, tmp_path, capsys):
    """--spm-model is an argument of --tok spm: with the default 13a tokeniser it would be silently unused."""
    args = ["complexity", "--src", str(tiny_en_de / "raw" / "valid.en"), "--tgt", str(tiny_en_de / "raw" / "valid.de"),
            "--spm-model", str(tiny_en_de / "spm.model"), "--json", str(tmp_path / "c.json")]
    assert main(args) == 2
    assert capsys.readouterr().err == ("error: --spm-model is read only by --tok spm, not --tok 13a: add --tok spm to "
                                       "tokenise with the model, or drop --spm-model\n")
    assert not (tmp_path / "c.json").exists()
    assert main([*args, "--tok", "none"]) == 2
    assert "not --tok none" in capsys.readouterr().err


def test_missing_file_and_bad_options_are_one_line_errors(corpus, capsys):
    assert main(["complexity", "--src", str(corpus / "nope.en"), "--tgt", str(corpus / "train.de.gz")]) == 2
    assert f"error: {corpus / 'nope.en'}: no such file" in capsys.readouterr().err
    assert main(["align", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.de.gz"), "-I", "0"]) == 2
    assert "error: -I (iterations) must be >= 1" in capsys.readouterr().err
    assert main(["complexity", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.de.gz"),
                 "--tok", "spm"]) == 2
    assert "needs a sentencepiece model" in capsys.readouterr().err


def test_an_output_path_that_cannot_be_written_fails_before_the_computation(corpus, capsys):
    """A folder given as an output file, or a file as the report's folder: one line, exit 2, nothing computed
    (the score is printed only after the computation)."""
    text = ["--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.de.gz")]
    folder = corpus / "folder"
    folder.mkdir()
    for command in (["complexity", *text, "--json", str(folder)], ["reordering", *text, "--per-sentence", str(folder)]):
        assert main(command) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"error: {folder} is a folder, not a file: give a file path, e.g. {folder}/NAME\n"
    assert main(["report", "--data-dir", str(corpus), "--out", str(corpus / "train.en")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{corpus / 'train.en'} is a file, not a folder" in err
    assert list(folder.iterdir()) == []


# ---------------------------------------------------------------- tables with probability-0 entries

def test_a_table_entry_of_probability_0_adds_nothing(tmp_path, capsys, recwarn):
    """ln p = -inf, or a log-probability whose exp underflows (-800), is probability 0: 0 log 0 = 0 in C(d), a pair
    the distilled row lacks (the floor) in F(d); never NaN."""
    def table(name, text):
        (tmp_path / name).write_text(text)
        return str(tmp_path / name)

    def score(*args):
        assert main([*args, "--json", str(tmp_path / "out.json")]) == 0
        return json.loads((tmp_path / "out.json").read_text())["score"]

    assert score("complexity", "--table", table("t", "a\tb\t-inf\na\tc\t-1\n")) == 0.0
    # a: only c is left, H = 0; d: x underflows, y and z share the row, H = ln 2
    underflow = table("u", "a\tb\t-inf\na\tc\t-1\nd\tx\t-800\nd\ty\t-0.5\nd\tz\t-0.5\n")
    assert score("complexity", "--table", underflow) == pytest.approx(math.log(2) / 2)
    # q(b|a) = 0 is floored like a missing pair: q = (floor, 1) / (1 + floor) against p = (1/2, 1/2)
    half = math.log(0.5)
    floor = 1e-9
    expected = 0.5 * math.log(0.5 * (1 + floor) / floor) + 0.5 * math.log(0.5 * (1 + floor))
    real = table("real", f"a\tb\t{half}\na\tc\t{half}\n")
    assert score("faithfulness", "--real-table", real, "--distilled-table", table("kd", "a\tb\t-inf\na\tc\t-1\n")) \
        == pytest.approx(expected, rel=1e-12)
    # p(b|a) = 0 on the real side has no term: p(c|a) = 1 = q(c|a)
    assert score("faithfulness", "--real-table", table("t2", "a\tb\t-800\na\tc\t-1\n"),
                 "--distilled-table", table("kd2", "a\tc\t-2\n")) == 0.0
    assert "nan" not in capsys.readouterr().out
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_table_row_or_table_with_nothing_to_measure_is_refused(tmp_path, capsys):
    (tmp_path / "t").write_text("a\tb\t-1\nd\tx\t-800\nd\ty\t-inf\n")
    assert run_error(["complexity", "--table", str(tmp_path / "t")], capsys) == (
        f"error: {tmp_path / 't'}:2: every entry of 'd' has probability 0 (ln p -inf, or below about -745, where a "
        "double underflows), so its row holds no distribution; give it one entry with a larger ln p, or remove its "
        "lines\n")
    (tmp_path / "null").write_text("<eps>\tb\t-1\n")
    assert run_error(["faithfulness", "--real-table", str(tmp_path / "null"), "--distilled-table",
                      str(tmp_path / "null")], capsys) == (
        f"error: {tmp_path / 'null'}: the table has no row but <eps> (NULL), so no source word to measure; pass the "
        "whole table that fast_align -p wrote\n")


def test_frs_conventions_from_the_command_line_and_an_undefined_frs(tmp_path, capsys):
    (tmp_path / "links").write_text("0-1 1-0 2-2 3-3\n0-0\n")
    assert main(["reordering", "--alignments", str(tmp_path / "links")]) == 0
    assert capsys.readouterr().out.startswith("FRS = 0.3333 over 1 sentences (1 with < 2 aligned source words "
                                              "skipped) | reordering|alignments:")
    assert main(["reordering", "--alignments", str(tmp_path / "links"), "--frs-convention", "boundary"]) == 0
    assert capsys.readouterr().out.startswith("FRS = 0.7000 over 2 sentences (0 with nested target spans skipped)")
    (tmp_path / "short").write_text("0-0\n\n0-1 0-2\n")
    assert run_error(["reordering", "--alignments", str(tmp_path / "short")], capsys) == (
        f"error: {tmp_path / 'short'}: FRS is undefined, every one of its 3 sentences is skipped (with < 2 aligned "
        "source words); check the links\n")
    (tmp_path / "nested").write_text("0-0 0-2 1-1\n")
    assert "(with nested target spans); check the links" in run_error(
        ["reordering", "--alignments", str(tmp_path / "nested"), "--frs-convention", "boundary"], capsys)


def test_a_mode_mix_without_known_tokens_is_an_error(tmp_path, capsys):
    (tmp_path / "out.txt").write_text("xyz\n")
    (tmp_path / "de").write_text("ein mann\n")
    (tmp_path / "fr").write_text("un homme\n")
    assert run_error(["modes", str(tmp_path / "out.txt"), "--lang", f"de={tmp_path / 'de'}", "--lang",
                      f"fr={tmp_path / 'fr'}"], capsys) == (
        f"error: {tmp_path / 'out.txt'}: no line has a token that a --lang text holds, so there is no mode mix; give "
        "texts in the outputs' languages, tokenised alike (--tok)\n")


# ---------------------------------------------------------------- what a file is

def test_a_file_that_is_not_what_its_name_says(corpus, capsys):
    """gzip content without .gz, text named .gz, a cut-off gzip file, a directory: each says so, in one line."""
    packed = corpus / "packed.de"
    packed.write_bytes((corpus / "train.de.gz").read_bytes())
    text = ["--src", str(corpus / "train.en"), "--tgt"]
    assert run_error(["complexity", *text, str(packed)], capsys) == (
        f"error: {packed}: this file is gzip-compressed: name it .gz\n")
    (corpus / "table").write_bytes(gzip.compress(b"a\tb\t-1\n"))
    assert run_error(["complexity", "--table", str(corpus / "table")], capsys) == (
        f"error: {corpus / 'table'}: this file is gzip-compressed: name it .gz\n")
    (corpus / "plain.de.gz").write_text("\n".join(DE) + "\n")
    assert run_error(["complexity", *text, str(corpus / "plain.de.gz")], capsys) == (
        f"error: {corpus / 'plain.de.gz'}: this file is not gzip-compressed, though its name ends with .gz: drop the "
        ".gz from its name, or compress it\n")
    (corpus / "cut.de.gz").write_bytes((corpus / "train.de.gz").read_bytes()[:-12])
    assert f"error: {corpus / 'cut.de.gz'}: damaged gzip file (" in run_error(
        ["complexity", *text, str(corpus / "cut.de.gz")], capsys)
    folder = corpus / "folder.de"
    folder.mkdir()
    assert run_error(["complexity", *text, str(folder)], capsys) == (
        f"error: {folder}: is a directory, not a file; give the path of a text file in it\n")
    assert run_error(["report", "--real-src", str(corpus / "train.en"), "--real-tgt", str(corpus / "train.de.gz"),
                      "--set", f"kd={corpus / 'train.en'},{folder}", "--out", str(corpus / "r")], capsys) == (
        f"error: --set kd: {folder} is a directory, not a file; give the path of a text file\n")


# ---------------------------------------------------------------- a report folder is one run's

def report_args(corpus, *sets):
    return ["report", "--real-src", str(corpus / "train.en"), "--real-tgt", str(corpus / "train.de.gz"),
            *(f"--set={name}={corpus / 'train.en'},{corpus / 'train.de.gz'}" for name in sets),
            "--out", str(corpus / "report")]


def folder_bytes(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def hidden(corpus):
    """Temporary files or folders left anywhere under the corpus folder."""
    return [path for path in corpus.rglob(".*")]


def test_a_report_that_fails_leaves_the_previous_one_whole(corpus, capsys, monkeypatch):
    import matplotlib.figure

    assert main(report_args(corpus)) == 0
    before = folder_bytes(corpus / "report")
    assert sorted(before) == ["complexity_vs_faithfulness.png", "report.json", "report.md"]

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        main(report_args(corpus, "copy"))  # fails while it draws the figure, after the texts
    assert folder_bytes(corpus / "report") == before and hidden(corpus) == []
    monkeypatch.undo()
    # the figure's place taken by a folder: the new report replaces the folder whole, that folder with it
    (corpus / "report" / "complexity_vs_faithfulness.png").unlink()
    (corpus / "report" / "complexity_vs_faithfulness.png").mkdir()
    assert main(report_args(corpus, "copy")) == 0
    assert "| copy |" in (corpus / "report" / "report.md").read_text()
    assert (corpus / "report" / "complexity_vs_faithfulness.png").is_file() and hidden(corpus) == []
    capsys.readouterr()
    # a folder holding something else than a report is refused before any work, and left alone
    other = corpus / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    assert run_error([*report_args(corpus)[:-1], str(other)], capsys) == (
        f"error: --out {other} exists and is not an analysis report (no report.md); it would be replaced: choose "
        "another --out or delete it\n")
    assert folder_bytes(other) == {"notes.txt": b"mine\n"}


def test_a_sigterm_while_the_report_draws_leaves_the_previous_one_whole(corpus):
    """The second run blocks inside the figure's savefig, its temporary file and folder made and the texts
    written, until the test has sent SIGTERM: it ends by SIGTERM, the previous report whole, nothing left behind."""
    import signal
    import subprocess
    import sys

    from nat_kd.corpus import PROJECT_ROOT

    assert main(report_args(corpus)) == 0
    before = folder_bytes(corpus / "report")
    script = ("import sys, matplotlib.figure\n"
              "def blocked(self, *args, **kwargs):\n"
              "    print('drawing', flush=True)\n"
              "    sys.stdin.read()\n"  # returns only when the test closes the pipe
              "matplotlib.figure.Figure.savefig = blocked\n"
              "from nat_kd.analyze import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    child = subprocess.Popen([sys.executable, "-c", script, *report_args(corpus, "copy")], cwd=PROJECT_ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "drawing\n"
        assert hidden(corpus)  # the temporary folder and figure exist while it draws
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGTERM, err
    assert folder_bytes(corpus / "report") == before and hidden(corpus) == []


def test_a_set_whose_backend_decodes_its_own_way_has_no_strategy_in_the_report(tmp_path):
    """meta.json's strategy is null for a backend that declares none: the report's row says nothing, not "None"."""
    from nat_kd.analysis.report import set_from_dir

    folder = tmp_path / "own"
    folder.mkdir()
    for lang in ("en", "de"):
        (folder / f"train.{lang}").write_text("a b\n", encoding="utf-8")
    (folder / "meta.json").write_text(json.dumps({"name": "own", "strategy": None, "split": "train",
                                                  "files": {"source": "train.en", "target": "train.de"}}))
    assert set_from_dir(folder, None, "en", "de").strategy == ""
