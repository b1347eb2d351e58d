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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nat_kd import __version__, markdown
from nat_kd.analysis.align import RECOMMENDED, AlignerOptions
from nat_kd.analysis.card import frequency_markdown, refresh_card
from nat_kd.analysis.metrics import Complexity, Faithfulness, Modes, Reordering, UnigramModels, align_corpus
from nat_kd.analysis.metrics.base import Signature, TokenizedPairs, parallel_lines, unit_name
from nat_kd.analysis.metrics.bleu import BleuStatistics, streamed_bleu
from nat_kd.analysis.metrics.faithfulness import DEFAULT_FLOOR, InterpolatedFaithfulness, missing_mass
from nat_kd.analysis.metrics.frequency import DEFAULT_BUCKETS, Vocabulary, frequency_table, linked_pairs
from nat_kd.analysis.metrics.reordering import line_scores
from nat_kd.analysis.metrics.surface import surface_stats
from nat_kd.analysis.plotting import plot_complexity_faithfulness, plot_mode_mix
from nat_kd.analysis.tokenizers import Tokenizer
from nat_kd.artifacts import DistilledSet
from nat_kd.atomic import write_text
from nat_kd.corpus import CorpusError, iter_lines, read_lines, split_file


@dataclass
class DataSet:
    name: str
    src: Path
    tgt: Path
    strategy: str = ""
    directory: Path | None = None  # a distilled set's folder: the report refreshes its card and scores.tsv


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
    return DataSet(str(meta.get("name") or distilled.root.name), src, tgt, str(meta.get("strategy", "")),
                   distilled.root if "files" in meta else None)  # written by the generator or nat_kd.mix


def set_from_arg(text: str) -> DataSet:
    """``NAME=SRC_FILE,TGT_FILE``."""
    name, eq, files = text.partition("=")
    src, comma, tgt = files.partition(",")
    if not (name and eq and src and comma and tgt):
        raise CorpusError(f"--set {text!r}: expected NAME=SRC_FILE,TGT_FILE")
    for path in (src, tgt):
        if not Path(path).is_file():
            raise CorpusError(f"--set {name}: no such file {path}")
    return DataSet(name, Path(src), Path(tgt))


@dataclass
class Report:
    rows: list[dict]
    signature: dict
    languages: list[str] = field(default_factory=list)
    metric_signatures: dict = field(default_factory=dict)  # C(d), F(d), FRS: each its sacrebleu-style signature
    sentence_frs: dict = field(default_factory=dict)  # set name -> each line's FRS (NaN: dropped or < 2 words)

    COLUMNS = (("name", "set", ""), ("strategy", "strategy", ""), ("sentences", "pairs", ""),
               ("complexity", "C(d)", ".4f"), ("faithfulness", "F(d)", ".4f"), ("words_losing_all", "words losing every translation", ""),
               ("reordering", "FRS", ".4f"), ("bleu", "BLEU", ".2f"), ("length_ratio", "len ratio", ".3f"))

    def to_markdown(self) -> str:
        columns = list(self.COLUMNS) + ([("mode_purity", "purity", ".3f")] if self.languages else [])
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
        """report.md, report.json, complexity_vs_faithfulness.png (and mode_mix.png), each written atomically."""
        out_dir = Path(out_dir)
        paths = {"markdown": out_dir / "report.md", "json": out_dir / "report.json",
                 "figure": out_dir / "complexity_vs_faithfulness.png"}
        write_text(paths["markdown"], self.to_markdown())
        write_text(paths["json"], self.to_json())
        unit = unit_name(self.signature.get("log", "e"))
        plot_complexity_faithfulness(self.rows, paths["figure"], unit)
        if self.languages:
            paths["modes_figure"] = out_dir / "mode_mix.png"
            plot_mode_mix(self.rows, self.languages, paths["modes_figure"])
        return paths

    def refresh_cards(self, real: DataSet, sets: list[DataSet]) -> list[Path]:
        """Each distilled set folder's card (with this report's C(d), F(d), FRS and frequency buckets) and its
        scores.tsv (with each line's FRS); returns the folders refreshed."""
        rows = {row["name"]: row for row in self.rows}
        real_row, done = rows[real.name], []
        for data in sets:
            if data.directory is None:
                continue
            row = rows[data.name]
            analysis = {key: row[key] for key in ("complexity", "faithfulness", "words_losing_all", "reordering",
                                                  "frequency_buckets")}
            analysis["real"] = {"name": real.name, **{key: real_row[key] for key in
                                                       ("complexity", "reordering", "frequency_buckets")}}
            analysis["signatures"] = self.metric_signatures
            refresh_card(data.directory, reference=real.tgt, analysis=analysis, frs=self.sentence_frs[data.name])
            done.append(data.directory)
        return done


class AnalysisReport:
    """Align every set with the same tokeniser and aligner settings, then score them all."""

    def __init__(self, tokenizer: Tokenizer, options: AlignerOptions = RECOMMENDED, aligner: str = "builtin",
                 log_base: str = "e", floor: float = DEFAULT_FLOOR, mode_texts: dict[str, list[str]] | None = None,
                 drop_empty: bool = False, buckets: list[int] = DEFAULT_BUCKETS):
        self.tokenizer, self.options, self.aligner, self.drop_empty = tokenizer, options, aligner, drop_empty
        self.buckets = list(buckets)
        self.complexity = Complexity(log_base)
        self.faithfulness = Faithfulness(log_base, floor)
        self.reordering = Reordering()
        self.modes = None
        if mode_texts:
            models = UnigramModels.from_texts({lang: tokenizer.corpus(t) for lang, t in mode_texts.items()})
            self.modes = Modes(models)

    def run(self, real: DataSet, distilled: list[DataSet]) -> Report:
        names = [real.name] + [d.name for d in distilled]
        if len(set(names)) != len(names):
            raise CorpusError(f"set names must differ, got {names}; name them with --set NAME=... or meta.json")
        # the real data's row comes first: it sets the source-word counts and the linked pairs others are held to
        self._vocabularies, self._frs = (Vocabulary(), Vocabulary()), {}
        self._source_counts, self._real_links = None, None
        real_aligned = self._align(real)
        real_table = real_aligned.result.exported_table()
        rows = [self._row(real, real, real_aligned, real_table)]
        for data in distilled:
            rows.append(self._row(data, real, self._align(data), real_table))
        bleu_sig = BleuStatistics(self.tokenizer.lowercase).signature()
        settings, log = real_aligned.settings, self.complexity.log_base
        signature = {**settings, "log": log, "floor": self.faithfulness.floor,
                     "frs": "drop-unaligned,leftmost-target", "bleu": bleu_sig, "nat_kd": __version__,
                     "frequency_buckets": f"real-source-count>={','.join(map(str, self.buckets))},pairs:viterbi-links"}
        metric_signatures = {
            "complexity": str(Signature("complexity", {**settings, "log": log})),
            "faithfulness": str(Signature("faithfulness", {**settings, "log": log, "floor": self.faithfulness.floor})),
            "reordering": str(Signature("reordering", {**settings, "frs": "drop-unaligned,leftmost-target"}))}
        return Report(rows, signature, self.modes.models.languages if self.modes else [], metric_signatures,
                      self._frs)

    def _align(self, data: DataSet):
        return align_corpus(iter_lines(data.src), iter_lines(data.tgt), self.tokenizer, self.options, self.aligner,
                            (str(data.src), str(data.tgt)), self.drop_empty)

    def _bleu(self, data: DataSet, real: DataSet):
        """Corpus BLEU of the set's targets against the real ones, streamed: no whole text is held."""
        lines = parallel_lines(iter_lines(data.tgt), iter_lines(real.tgt), (str(data.tgt), str(real.tgt)))
        return streamed_bleu(lines, self.tokenizer.lowercase)

    def _linked(self, data: DataSet, aligned) -> tuple[np.ndarray, Counter]:
        """The set's linked word pairs (``frequency.linked_pairs``) and its source-word counts, from the tokens
        the aligner saw (tokenised again, a block at a time)."""
        names, counts = (str(data.src), str(data.tgt)), Counter()

        def counted():
            for src, tgt in TokenizedPairs(parallel_lines(iter_lines(data.src), iter_lines(data.tgt), names),
                                           self.tokenizer, names, self.drop_empty):
                counts.update(src)
                yield src, tgt

        return linked_pairs(counted(), aligned.result.alignment_shards(), *self._vocabularies), counts

    def _row(self, data: DataSet, real: DataSet, aligned, real_table) -> dict:
        table = aligned.result.exported_table()
        complexity = self.complexity.table_score(table)
        faithfulness = self.faithfulness.table_score(real_table, table)  # same settings by construction
        reordering = self.reordering.corpus_score(aligned.result.alignment_shards())
        bleu = self._bleu(data, real)
        links, counts = self._linked(data, aligned)
        if self._source_counts is None:
            self._source_counts, self._real_links = counts, links
        source_ids = self._vocabularies[0].ids
        buckets = frequency_table({source_ids[w]: c for w, c in self._source_counts.items()}, self.buckets,
                                  self._real_links, links, complexity.by_frequency(self._source_counts, self.buckets))
        self._frs[data.name] = line_scores(aligned, reordering.sentences)
        row = {"name": data.name, "strategy": data.strategy, "sentences": aligned.pairs,
               "dropped_empty": aligned.dropped_empty,
               "complexity": complexity.score,
               "faithfulness": faithfulness.score, "missing_words": faithfulness.missing_words,
               "reordering": reordering.score,
               "frequency_buckets": [b.as_dict() for b in buckets],
               # the frequency table's last column, summed: "missing_words" (source words absent from the
               # distilled table) is 0 whenever the sources are the real ones, and says nothing of translations
               "words_losing_all": sum(b.words_losing_all for b in buckets),
               "bleu": bleu.score, "length_ratio": bleu.sys_len / bleu.ref_len if bleu.ref_len else float("nan"),
               "src": str(data.src), "tgt": str(data.tgt)}
        if self.modes:
            score = self.modes.corpus_score(self.tokenizer.corpus(read_lines(data.tgt)))
            row.update(mode_purity=score.mean_purity, mode_mix=score.mix, mode_unknown=score.unknown)
        return row


class DetailedAnalysisReport(AnalysisReport):
    """The report's measures plus what tells a small corpus apart from the paper's: C(d) within buckets of
    source-word frequency (counted in the real data) and weighted by token count, F(d) at several smoothing
    floors, with the real mass that the floor prices, and interpolated with a unigram instead of floored,
    the targets' word types and tokens, and the share of targets with a repeated n-gram."""

    def __init__(self, tokenizer: Tokenizer, *, buckets: list[int], floors: list[float], interpolation: float,
                 repeat_n: list[int], **kwargs):
        super().__init__(tokenizer, buckets=buckets, **kwargs)
        self.repeat_n = list(repeat_n)
        self.floored = [Faithfulness(self.complexity.log_base, floor) for floor in floors]
        self.interpolated = InterpolatedFaithfulness(interpolation, self.complexity.log_base)

    def run(self, real: DataSet, distilled: list[DataSet]) -> Report:
        report = super().run(real, distilled)
        report.signature |= {
            "complexity_buckets": f"real-source-count>={','.join(map(str, self.buckets))}",
            "complexity_token_weighted": "weight:real-source-token-count",
            "faithfulness_interpolated": f"interpolate({self.interpolated.lam},add-one-unigram-of-distilled-targets)",
            "repeated_ngram": f"n:{','.join(map(str, self.repeat_n))},target-side,tokenised-as-above"}
        return report

    def _row(self, data: DataSet, real: DataSet, aligned, real_table) -> dict:
        row = super()._row(data, real, aligned, real_table)
        # the tokens the aligner saw, held in memory: these measures are for corpora of Multi30k's size
        names = (str(data.src), str(data.tgt))
        pairs = list(TokenizedPairs(parallel_lines(iter_lines(data.src), iter_lines(data.tgt), names),
                                    self.tokenizer, names, self.drop_empty))
        table = aligned.result.exported_table()
        complexity = self.complexity.table_score(table)
        surface = surface_stats([" ".join(tgt) for _, tgt in pairs], self.repeat_n)
        target_counts = Counter(w for _, tgt in pairs for w in tgt)
        row.update(
            complexity_token_weighted=complexity.token_weighted(self._source_counts),
            complexity_buckets=complexity.by_frequency(self._source_counts, self.buckets),
            faithfulness_floors={str(f.floor): f.table_score(real_table, table).score for f in self.floored},
            missing_mass=missing_mass(real_table, table),
            faithfulness_interpolated=self.interpolated.table_score(real_table, table, target_counts).score,
            **surface.as_dict())
        return row
