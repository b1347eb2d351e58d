"""The measure registry: every table of measures reads MEASURES, in its order; and a measure registered from
outside (docs/extending.md's worked example, ``TargetWords``) shows up in ``analyze report``'s output, the
dataset card and choose's ranking without a change to any of them."""
import json
import re

import pytest

from conftest import ROOT
from nat_kd.analysis.metrics import MEASURES, Column, Measure, shown
from nat_kd.analysis.metrics.base import CARD, CENTRAL, CORRELATION, DECODING, RANKING, REPORT
from nat_kd.analyze import main

EN = ["a man rides a horse .", "a woman reads a book .", "two dogs play .", "a man reads ."]
DE = ["ein mann reitet ein pferd .", "eine frau liest ein buch .", "zwei hunde spielen .", "ein mann liest ."]
KD = ["ein mann reitet .", "eine frau liest ein buch .", "zwei hunde .", "ein mann liest ."]


def documented_measure() -> type[Measure]:
    """The class of docs/extending.md's "Add a measure", run from the page."""
    section = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8").split("## Add a measure", 1)[1]
    namespace = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S).group(1), namespace)
    return namespace["TargetWords"]


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


def test_a_measure_registered_from_outside_shows_in_the_report_the_card_and_the_ranking(corpus, monkeypatch):
    target_words = documented_measure()
    markdown, _ = report(corpus, "before")
    assert "target words" not in markdown and "target words" not in (corpus / "kd" / "CARD.md").read_text()

    monkeypatch.setitem(MEASURES, target_words.name, target_words)
    markdown, report_json = report(corpus, "after")
    rows = {row["name"]: row for row in report_json["rows"]}
    assert rows["real"]["target_words"] == 5.0 and rows["kd"]["target_words"] == 4.25
    # a measure that needs nothing joins those that need nothing, before the files
    assert list(rows["kd"]) == ["name", "strategy", "sentences", "dropped_empty", "complexity", "faithfulness",
                                "missing_words", "reordering", "frequency_buckets", "words_losing_all", "bleu",
                                "length_ratio", "target_words", "src", "tgt"]
    first = table_lines(markdown, "| set |")
    assert first[0].endswith("| BLEU | len ratio | target words |")
    assert first[2].endswith("| 5.00 |") and first[3].endswith("| 4.25 |")

    card = (corpus / "kd" / "CARD.md").read_text(encoding="utf-8")
    measures = table_lines(card, "| set | C(d) |")
    assert measures[0] == "| set | C(d) | F(d) | words losing every translation | FRS | target words |"
    assert measures[2].startswith("| real |") and measures[2].endswith("| 5.00 |")
    assert measures[3].startswith("| this set |") and measures[3].endswith("| 4.25 |")
    card_json = json.loads((corpus / "kd" / "card.json").read_text(encoding="utf-8"))
    assert card_json["analysis"]["target_words"] == 4.25 and card_json["analysis"]["real"]["target_words"] == 5.0

    ranked = table_lines(ranking_text(report_json), "| rank |")
    assert ranked[0].endswith("| length ratio | BLEU vs real | target words |")
    assert ranked[2].startswith("| 1 | kd | 14.50 |") and ranked[2].endswith("| 4.25 |")
    assert ranked[3].startswith("| 2 | real | 12.00 |") and ranked[3].endswith("| 5.00 |")


def test_every_table_shows_the_registered_measures_in_its_order():
    """The column headers of the report, the card, choose's ranking and the study's tables, as they are
    written (the study's correlation table: its row labels)."""
    def labels(table):
        return [column.label for _, column in shown(table)]

    assert labels(REPORT) == ["C(d)", "F(d)", "words losing every translation", "FRS", "BLEU", "len ratio", "purity"]
    assert labels(CARD) == ["C(d)", "F(d)", "words losing every translation", "FRS"]
    assert labels(RANKING) == ["C(d) paper", "C(d) token-weighted", "F(d) interp.", "FRS", "length ratio",
                               "BLEU vs real"]
    assert labels(CENTRAL) == ["C(d) paper", "C(d) token-weighted", "F(d) 1e-9", "F(d) interp.", "FRS",
                               "BLEU vs real", "length ratio"]
    assert labels(CORRELATION) == ["C(d), paper (mean over types)", "C(d), token-weighted", "F(d), floor 1e-9",
                                   "F(d), interpolated", "real mass missing", "FRS", "BLEU vs real",
                                   "length ratio vs real"]
    assert labels(DECODING) == ["complexity C(d)", "faithfulness F(d)", "FRS", "BLEU vs real", "length ratio"]
    assert [column.format for _, column in shown(RANKING)] == [".3f"] * 5 + [".2f"]


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
