"""The measure registry: every table of measures reads MEASURES, in its order; and a measure registered from
outside (docs/extending.md's worked example, ``TargetWords``) shows up in ``analyze report``'s output, the
dataset card, its per-line form in scores.tsv and the card's figure, and choose's ranking without a change to any
of them. The tests check the built-in measures and the ones they register, whatever else is registered."""
import json
import re

import numpy as np
import pytest

from conftest import ROOT
from nat_kd.analysis.card import histogram_columns
from nat_kd.analysis.metrics import MEASURES, Column, Measure, register_measure, shown
from nat_kd.analysis.metrics.base import CARD, CENTRAL, CORRELATION, DECODING, RANKING, REPORT
from nat_kd.analysis.metrics.sentence import SentenceScores
from nat_kd.analyze import main
from nat_kd.corpus import CorpusError

EN = ["a man rides a horse .", "a woman reads a book .", "two dogs play .", "a man reads ."]
DE = ["ein mann reitet ein pferd .", "eine frau liest ein buch .", "zwei hunde spielen .", "ein mann liest ."]
KD = ["ein mann reitet .", "eine frau liest ein buch .", "zwei hunde .", "ein mann liest ."]


@pytest.fixture
def registry():
    """MEASURES as it was, again after the test (the report and the card hold the same dict)."""
    before = dict(MEASURES)
    yield MEASURES
    MEASURES.clear()
    MEASURES.update(before)


def documented_measure() -> type[Measure]:
    """The class of docs/extending.md's "Add a measure", run from the page: its module, then its registration."""
    section = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8").split("## Add a measure", 1)[1]
    namespace = {}
    module, registration = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    assert registration == "from nat_kd.analysis.metrics import register_measure\n\nregister_measure(TargetWords)\n"
    exec(module + registration, namespace)
    return namespace["TargetWords"]


def among(found: list, expected: list) -> list:
    """What of ``expected`` is in ``found``, in ``found``'s order: ``expected`` itself when all are there in this
    order, whatever else (a measure registered besides) stands between them."""
    return [item for item in found if item in expected]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


@pytest.fixture
def corpus(tmp_path):
    """Four real pairs, and a distilled set in the generator's layout (meta.json naming its files), whose
    targets have 4, 6, 3 and 4 words: 4.25 a line, the real ones 5.00."""
    for name, lines in (("real.en", EN), ("real.de", DE)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    kd = tmp_path / "kd"
    kd.mkdir()
    (kd / "train.en").write_text("\n".join(EN) + "\n", encoding="utf-8")
    (kd / "train.de").write_text("\n".join(KD) + "\n", encoding="utf-8")
    (kd / "meta.json").write_text(json.dumps({
        "name": "kd", "strategy": "beam", "split": "train", "source_lang": "en", "target_lang": "de", "sentences": 4,
        "empty_source_lines": [], "truncated_source_lines": [], "teacher": {},
        "files": {"source": "train.en", "target": "train.de"}}))
    return tmp_path


def report(corpus, out: str) -> tuple[str, dict]:
    assert main(["report", "--real-src", str(corpus / "real.en"), "--real-tgt", str(corpus / "real.de"),
                 "--set-dir", str(corpus / "kd"), "--out", str(corpus / out)]) == 0
    return ((corpus / out / "report.md").read_text(encoding="utf-8"),
            json.loads((corpus / out / "report.json").read_text(encoding="utf-8")))


def table_lines(text: str, header: str) -> list[str]:
    """The lines of the Markdown table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return lines[start:next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))]


def ranking_text(report_json: dict) -> str:
    from nat_kd.choose import ranking, render

    records = {"analysis": {"result": report_json},
               "pilot.real": {"result": {"curve": [{"updates": 500, "valid_bleu": 12.0}]}},
               "pilot.kd": {"result": {"curve": [{"updates": 500, "valid_bleu": 14.5}]}}}
    return render(ranking(records, ["kd"], "nat", "2x128", 500), "kd_nat_tiny")


def test_a_measure_registered_from_outside_shows_in_the_report_the_card_and_the_ranking(corpus, registry):
    markdown, _ = report(corpus, "before")
    assert "target words" not in markdown and "target words" not in (corpus / "kd" / "CARD.md").read_text()

    target_words = documented_measure()
    assert list(MEASURES)[-1] == "target_words" and MEASURES["target_words"] is target_words
    markdown, report_json = report(corpus, "after")
    rows = {row["name"]: row for row in report_json["rows"]}
    assert rows["real"]["target_words"] == 5.0 and rows["kd"]["target_words"] == 4.25
    # a measure that needs nothing joins those that need nothing, before the files
    keys, expected = list(rows["kd"]), ["name", "strategy", "sentences", "dropped_empty", "complexity",
                                        "faithfulness", "missing_words", "reordering", "frequency_buckets",
                                        "words_losing_all", "bleu", "length_ratio", "target_words", "src", "tgt"]
    assert among(keys, expected) == expected
    assert keys.index("target_words") == keys.index("src") - 1
    first = table_lines(markdown, "| set |")
    expected = ["set", "C(d)", "F(d)", "FRS", "BLEU", "len ratio", "target words"]
    assert among(cells(first[0]), expected) == expected
    assert first[0].endswith("| target words |")
    assert first[2].endswith("| 5.00 |") and first[3].endswith("| 4.25 |")

    card = (corpus / "kd" / "CARD.md").read_text(encoding="utf-8")
    measures = table_lines(card, "| set | C(d) |")
    expected = ["set", "C(d)", "F(d)", "words losing every translation", "FRS", "target words"]
    assert among(cells(measures[0]), expected) == expected
    assert measures[0].endswith("| target words |")
    assert measures[2].startswith("| real |") and measures[2].endswith("| 5.00 |")
    assert measures[3].startswith("| this set |") and measures[3].endswith("| 4.25 |")
    card_json = json.loads((corpus / "kd" / "card.json").read_text(encoding="utf-8"))
    assert card_json["analysis"]["target_words"] == 4.25 and card_json["analysis"]["real"]["target_words"] == 5.0

    # its per-line form: a column of the set's scores.tsv (KD's lines have 4, 6, 3 and 4 words), in the card's
    # per-line summary and among its histograms, after FRS's
    scores = SentenceScores.read(corpus / "kd" / "scores.tsv")
    assert scores["target_words"].tolist() == [4.0, 6.0, 3.0, 4.0] and len(scores["frs"]) == 4
    assert card_json["sentence_scores"]["summary"]["target_words"]["mean"] == 4.25
    expected = ["bleu", "chrf", "length_ratio", "frs", "target_words", "repeated_ngrams"]
    assert among(histogram_columns(scores), expected) == expected
    assert "| target_words | 4 | 4.2500 |" in card

    ranked = table_lines(ranking_text(report_json), "| rank |")
    expected = ["rank", "FRS", "length ratio", "BLEU vs real", "target words"]
    assert among(cells(ranked[0]), expected) == expected
    assert ranked[0].endswith("| target words |")
    assert ranked[2].startswith("| 1 | kd | 14.50 |") and ranked[2].endswith("| 4.25 |")
    assert ranked[3].startswith("| 2 | real | 12.00 |") and ranked[3].endswith("| 5.00 |")


def test_register_measure_refuses_a_taken_name_or_per_line_column(registry):
    def measure(name, line_column=None):
        return type(name.title(), (Measure,), {"__module__": __name__, "name": name, "label": name,
                                               "line_column": line_column,
                                               "corpus_score": lambda self, data: 0.0})

    toy = register_measure(measure("toy", "toy"))
    assert register_measure(toy) is toy and list(MEASURES).count("toy") == 1  # the same class again: no change
    with pytest.raises(ValueError, match=r"^measure 'reordering' is nat_kd.analysis.metrics.reordering."
                                         r"FuzzyReordering already, not test_measures.Reordering$"):
        register_measure(measure("reordering"))
    with pytest.raises(ValueError, match=r"^scores.tsv's column 'frs' is measure 'reordering''s already: give "
                                         r"Other a line_column of its own$"):
        register_measure(measure("other", "frs"))
    with pytest.raises(ValueError, match=r"^scores.tsv's column 'bleu' is the sentence scorer's already"):
        register_measure(measure("other", "bleu"))
    assert "other" not in MEASURES and MEASURES["reordering"].__name__ == "FuzzyReordering"


def test_every_column_of_scores_tsv_is_written_and_drawn(tmp_path):
    """A column that a measure adds is written, read back and drawn, whatever its name; the 0/1 flags are not
    drawn, the repeated n-gram counts come last."""
    scores = SentenceScores({name: np.array([1.0, 0.0]) for name in (
        "bleu", "repeated_ngrams", "repeated", "logprob", "replaced", "my_score")})
    scores.write(tmp_path / "scores.tsv")
    assert (tmp_path / "scores.tsv").read_text().splitlines()[0].split("\t") == [
        "line", "bleu", "repeated_ngrams", "repeated", "logprob", "replaced", "my_score"]
    assert SentenceScores.read(tmp_path / "scores.tsv")["my_score"].tolist() == [1.0, 0.0]
    assert histogram_columns(scores) == ["bleu", "logprob", "my_score", "repeated_ngrams"]
    for header in ("line\tbleu\tbleu", "line\tbleu\t", "number\tbleu"):  # a column twice, unnamed; no line column
        (tmp_path / "bad.tsv").write_text(header + "\n1\t2\t3\n")
        with pytest.raises(CorpusError, match=r"bad.tsv:1: not a scores.tsv header \(expected line, then the names "
                                              r"of its columns, each once\)"):
            SentenceScores.read(tmp_path / "bad.tsv")


def test_every_table_shows_the_registered_measures_in_its_order():
    """The built-in measures' column headers in the report, the card, choose's ranking and the study's tables, as
    they are written (the study's correlation table: its row labels), whatever else is registered."""
    for table, expected in ((REPORT, ["C(d)", "F(d)", "words losing every translation", "FRS", "BLEU", "len ratio",
                                      "purity"]),
                            (CARD, ["C(d)", "F(d)", "words losing every translation", "FRS"]),
                            (RANKING, ["C(d) paper", "C(d) token-weighted", "F(d) interp.", "FRS", "length ratio",
                                       "BLEU vs real"]),
                            (CENTRAL, ["C(d) paper", "C(d) token-weighted", "F(d) 1e-9", "F(d) interp.", "FRS",
                                       "BLEU vs real", "length ratio"]),
                            (CORRELATION, ["C(d), paper (mean over types)", "C(d), token-weighted",
                                           "F(d), floor 1e-9", "F(d), interpolated", "real mass missing", "FRS",
                                           "BLEU vs real", "length ratio vs real"]),
                            (DECODING, ["complexity C(d)", "faithfulness F(d)", "FRS", "BLEU vs real",
                                        "length ratio"])):
        assert among([column.label for _, column in shown(table)], expected) == expected, table
    formats = {column.label: column.format for _, column in shown(RANKING)}
    assert [formats[label] for label in ("C(d) paper", "C(d) token-weighted", "F(d) interp.", "FRS", "length ratio",
                                         "BLEU vs real")] == [".3f"] * 5 + [".2f"]


def test_a_column_stands_before_the_measure_it_names_and_takes_the_measure_s_own_label(monkeypatch):
    def measure(name, **columns):
        return type(name, (Measure,), {"name": name, "label": name.upper(), "format": ".1f", "tables": columns,
                                       "corpus_score": lambda self, data: 0.0})

    monkeypatch.setattr("nat_kd.analysis.metrics.MEASURES", {m.name: m for m in (
        measure("a", t=Column()), measure("b", t=Column("bee", ".2f")), measure("c", u=Column()),
        measure("d", t=Column(before="a")), measure("e", t=Column(before="c")))})
    assert [(m.name, column.label, column.format) for m, column in shown("t")] == [
        ("d", "D", ".1f"), ("a", "A", ".1f"), ("b", "bee", ".2f"), ("e", "E", ".1f")]
    assert [m.name for m, _ in shown("u")] == ["c"]
