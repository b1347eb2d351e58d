"""One table comparing the real data with distilled sets: complexity, faithfulness, reordering, BLEU and
length ratio (plus the mode mix when per-language unigram texts are given), and a table by source-word
frequency (nat_kd.analysis.metrics.frequency), as Markdown, JSON and figures; the cards of distilled set
folders are refreshed with the same numbers (nat_kd.analysis.card).

A distilled set is either a directory holding ``<split>.<src>`` and ``<split>.<tgt>`` (raw, detokenised,
line-aligned with the real data; optional ``meta.json`` whose ``name``/``strategy`` label the point), or
an explicit ``NAME=SRC_FILE,TGT_FILE``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from nat_kd import __version__, markdown
from nat_kd.analysis.align import RECOMMENDED, AlignerOptions
from nat_kd.analysis.card import card_analysis, frequency_markdown, refresh_card
from nat_kd.analysis.metrics import MEASURES, MeasuredSet, MeasureSettings, UnigramModels, align_corpus, shown
from nat_kd.analysis.metrics.base import DETAILS, MODES, REPORT, Measure, unit_name
from nat_kd.analysis.metrics.bleu import BleuStatistics
from nat_kd.analysis.metrics.faithfulness import DEFAULT_FLOOR
from nat_kd.analysis.metrics.frequency import DEFAULT_BUCKETS
from nat_kd.analysis.plotting import plot_complexity_faithfulness, plot_mode_mix
from nat_kd.analysis.tokenizers import Tokenizer
from nat_kd.artifacts import DistilledSet
from nat_kd.atomic import building_directory, check_replaceable, remove_stale_builds, write_text
from nat_kd.corpus import CorpusError, iter_lines, split_file

REPORT_MARKER = "report.md"  # in every report folder: what tells one from a folder that holds something else


@dataclass
class DataSet:
    name: str
    src: Path
    tgt: Path
    strategy: str = ""
    directory: Path | None = None  # a distilled set's folder: the report refreshes its card and scores.tsv
    real_repeats: int = 1  # its lines pair with the real data's this many times over (DistilledSet.real_repeats)


def check_report_folder(out_dir: str | Path) -> None:
    """Refuse an output folder that a report would replace though it holds something else than a report."""
    check_replaceable(out_dir, REPORT_MARKER, "an analysis report", "--out")


def set_from_dir(directory: str | Path, split: str | None, src_lang: str, tgt_lang: str) -> DataSet:
    """A distilled set directory: the text files its meta.json names (whatever the split it was distilled
    from), else ``<split>.<lang>`` (``split`` None: the one split the folder holds)."""
    distilled = DistilledSet(directory)
    if not distilled.root.is_dir():
        raise CorpusError(f"{distilled.root}: not a directory; pass a distilled set directory holding "
                          f"SPLIT.{src_lang} and SPLIT.{tgt_lang}")
    meta = distilled.meta() or {}
    files = meta.get("files", {})
    if files.get("source") and files.get("target") and split in (None, meta.get("split")):
        src, tgt = distilled.root / files["source"], distilled.root / files["target"]
    else:
        if split is None:
            src_splits, tgt_splits = ({p.name[:-len(lang) - 1] for p in distilled.root.glob(f"*.{lang}")}
                                      for lang in (src_lang, tgt_lang))
            splits = sorted(src_splits & tgt_splits)
            if len(splits) != 1:
                raise CorpusError(f"{distilled.root}: no meta.json, and {len(splits)} splits with both .{src_lang} "
                                  f"and .{tgt_lang} files ({', '.join(splits) or 'none'}); pass --split")
            split = splits[0]
        src, tgt = (split_file(distilled.root, split, lang, "--set-dir") for lang in (src_lang, tgt_lang))
    # a backend that decodes its own way records no strategy (null)
    return DataSet(str(meta.get("name") or distilled.root.name), src, tgt, meta.get("strategy") or "",
                   distilled.root if "files" in meta else None,  # written by the generator or nat_kd.mix
                   distilled.real_repeats())


def set_from_arg(text: str) -> DataSet:
    """``NAME=SRC_FILE,TGT_FILE``."""
    name, eq, files = text.partition("=")
    src, comma, tgt = files.partition(",")
    if not (name and eq and src and comma and tgt):
        raise CorpusError(f"--set {text!r}: expected NAME=SRC_FILE,TGT_FILE")
    for path in (src, tgt):
        if Path(path).is_dir():
            raise CorpusError(f"--set {name}: {path} is a directory, not a file; give the path of a text file")
        if not Path(path).is_file():
            raise CorpusError(f"--set {name}: no such file {path}")
    return DataSet(name, Path(src), Path(tgt))


@dataclass
class Report:
    rows: list[dict]
    signature: dict
    languages: list[str] = field(default_factory=list)
    metric_signatures: dict = field(default_factory=dict)  # measure -> its own signature (C(d), F(d), FRS)
    # set name -> scores.tsv column -> each line's score (FRS: NaN where dropped or < 2 aligned words)
    line_scores: dict = field(default_factory=dict)

    HEAD = (("name", "set", ""), ("strategy", "strategy", ""), ("sentences", "pairs", ""))

    def to_markdown(self) -> str:
        """The table of every measure the report shows (those the rows hold), then the mode mix, the frequency
        buckets and the settings."""
        measured = [(m.name, c.label, c.format) for m, c in shown(REPORT) if any(m.name in row for row in self.rows)]
        columns = [*self.HEAD, *measured]
        lines = [markdown.table([title for _, title, _ in columns],
                                [[markdown.cell(row.get(key), spec) for key, _, spec in columns]
                                 for row in self.rows]).rstrip("\n")]
        if self.languages:
            lines += ["", "Mode mix (mean p(l|y)): " + "; ".join(
                f"{row['name']}: " + ", ".join(f"{lang}={row['mode_mix'][lang]:.3f}" for lang in self.languages)
                for row in self.rows)]
        if any("frequency_buckets" in row for row in self.rows):
            lines += ["", "Source words by their count in the real data (C(d) within the bucket; of the word pairs "
                      "the real data links, the share this set links too; the words that lose every pair):", "",
                      frequency_markdown([(row["name"], row["frequency_buckets"]) for row in self.rows]).rstrip("\n")]
        lines += ["", "Settings: " + ", ".join(f"{k}={v}" for k, v in self.signature.items())]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
                 for row in self.rows]
        return json.dumps({"rows": clean, "signature": self.signature, "languages": self.languages,
                           "metric_signatures": self.metric_signatures}, indent=2, ensure_ascii=False) + "\n"

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """report.md, report.json, complexity_vs_faithfulness.png (and mode_mix.png): the folder is one run's,
        built beside ``out_dir`` and swapped in whole, so that a failure or a signal leaves the previous
        report as it was. ``out_dir`` must be absent, empty, or a report (``check_report_folder``)."""
        out_dir = Path(out_dir)
        check_report_folder(out_dir)
        remove_stale_builds(out_dir.resolve())  # left by a run killed while it wrote ("." resolved: its own name)
        names = {"markdown": "report.md", "json": "report.json", "figure": "complexity_vs_faithfulness.png"}
        if self.languages:
            names["modes_figure"] = "mode_mix.png"
        with building_directory(out_dir) as work:
            write_text(work / names["markdown"], self.to_markdown())
            write_text(work / names["json"], self.to_json())
            plot_complexity_faithfulness(self.rows, work / names["figure"], unit_name(self.signature.get("log", "e")))
            if self.languages:
                plot_mode_mix(self.rows, self.languages, work / names["modes_figure"])
        return {key: out_dir / name for key, name in names.items()}

    def refresh_cards(self, real: DataSet, sets: list[DataSet]) -> list[Path]:
        """Each distilled set folder's card (with this report's measures and frequency buckets) and its scores.tsv
        (with each line's per-line measures, FRS); returns the folders refreshed."""
        rows = {row["name"]: row for row in self.rows}
        done = []
        for data in sets:
            if data.directory is None:
                continue
            analysis = card_analysis(rows[data.name], rows[real.name], self.metric_signatures)
            refresh_card(data.directory, reference=real.tgt, analysis=analysis,
                         line_scores=self.line_scores[data.name])
            done.append(data.directory)
        return done


class AnalysisReport:
    """Align every set with the same tokeniser and aligner settings, then measure each with every registered
    measure whose needs the report meets (``nat_kd.analysis.metrics.MEASURES``)."""

    needs = {None}  # the measures' needs it meets (with --lang texts, MODES too)

    def __init__(self, tokenizer: Tokenizer, options: AlignerOptions = RECOMMENDED, aligner: str = "builtin",
                 log_base: str = "e", floor: float = DEFAULT_FLOOR, mode_texts: dict[str, list[str]] | None = None,
                 drop_empty: bool = False, buckets: list[int] = DEFAULT_BUCKETS, **details):
        """``details``: the detailed report's settings (``MeasureSettings``' floors, interpolation, repeat_n)."""
        self.tokenizer, self.options, self.aligner = tokenizer, options, aligner
        models = (UnigramModels.from_texts({lang: tokenizer.corpus(t) for lang, t in mode_texts.items()})
                  if mode_texts else None)
        self.settings = MeasureSettings(tokenizer, drop_empty, log_base, floor, tuple(buckets), modes=models,
                                        **details)
        needs = self.needs | ({MODES} if models else set())
        self.measures: list[Measure] = [measure(self.settings) for measure in MEASURES.values()
                                        if measure.needs in needs]

    def run(self, real: DataSet, distilled: list[DataSet]) -> Report:
        names = [real.name] + [d.name for d in distilled]
        if len(set(names)) != len(names):
            raise CorpusError(f"set names must differ, got {names}; name them with --set NAME=... or meta.json")
        # the real data's row comes first: it sets the source-word counts and the linked pairs others are held to
        measured_real = self._measured(real)
        rows, line_scores = [], {}
        for data in [real, *distilled]:
            measured = measured_real if data is real else self._measured(data, measured_real)
            rows.append(self._row(data, measured))
            line_scores[data.name] = {m.line_column: m.line_scores(measured) for m in self.measures if m.line_column}
        settings = measured_real.aligned.settings
        signed = [m for m in self.measures if m.signature_settings()]
        buckets = ",".join(map(str, self.settings.buckets))
        signature = {**settings, **{k: v for m in signed for k, v in m.signature_settings().items()},
                     "bleu": BleuStatistics(self.tokenizer.lowercase).signature(), "nat_kd": __version__,
                     "frequency_buckets": f"real-source-count>={buckets},pairs:viterbi-links"}
        return Report(rows, signature, self.settings.modes.languages if self.settings.modes else [],
                      {m.name: str(m.signature(settings)) for m in signed}, line_scores)

    def _measured(self, data: DataSet, real: MeasuredSet | None = None) -> MeasuredSet:
        aligned = align_corpus(iter_lines(data.src), iter_lines(data.tgt), self.tokenizer, self.options, self.aligner,
                               (str(data.src), str(data.tgt)), self.settings.drop_empty)
        return MeasuredSet(data.name, data.src, data.tgt, aligned, self.settings, real, data.real_repeats)

    def _row(self, data: DataSet, measured: MeasuredSet) -> dict:
        """The set's report row (report.json's order): its name and counts, the measures that need nothing, its
        files, then the measures that need MODES or DETAILS."""
        def scores(need):
            return {m.name: m.corpus_score(measured) for m in self.measures if m.needs == need}

        return {"name": data.name, "strategy": data.strategy, "sentences": measured.aligned.pairs,
                "dropped_empty": measured.aligned.dropped_empty, **scores(None), "src": str(data.src),
                "tgt": str(data.tgt), **scores(MODES), **scores(DETAILS)}


class DetailedAnalysisReport(AnalysisReport):
    """The report's measures plus what tells a small corpus apart from the paper's: C(d) within buckets of
    source-word frequency (counted in the real data) and weighted by token count, F(d) at several smoothing
    floors, with the real mass that the floor prices, and interpolated with a unigram instead of floored,
    the targets' word types and tokens, and the share of targets with a repeated n-gram (the measures that
    need DETAILS)."""

    needs = {None, DETAILS}

    def __init__(self, tokenizer: Tokenizer, *, buckets: list[int], floors: list[float], interpolation: float,
                 repeat_n: list[int], **kwargs):
        super().__init__(tokenizer, buckets=buckets, floors=tuple(floors), interpolation=interpolation,
                         repeat_n=tuple(repeat_n), **kwargs)

    def run(self, real: DataSet, distilled: list[DataSet]) -> Report:
        report = super().run(real, distilled)
        report.signature |= {
            "complexity_buckets": f"real-source-count>={','.join(map(str, self.settings.buckets))}",
            "complexity_token_weighted": "weight:real-source-token-count",
            "faithfulness_interpolated": f"interpolate({self.settings.interpolation},"
                                         "add-one-unigram-of-distilled-targets)",
            "repeated_ngram": f"n:{','.join(map(str, self.settings.repeat_n))},target-side,tokenised-as-above"}
        return report
