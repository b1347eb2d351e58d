"""The dataset card of a distilled set: CARD.md for people, card.json for programs, and a histogram figure.

It says which teacher and settings made the set, how many lines are empty or were truncated, how close the
targets are to the references line by line (the distributions of scores.tsv), which outputs repeat
themselves, and shows ten seeded random examples. The generator writes it with every set; the data measures
that need the corpus aligned (C(d), F(d), FRS, the frequency-bucket table) are added when
``python -m nat_kd.analyze report`` refreshes it (``refresh_card``), and nat_kd.mix adds its rule and counts.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np

from nat_kd import __version__, markdown
from nat_kd.analysis.metrics import shown
from nat_kd.analysis.metrics.base import CARD
from nat_kd.analysis.metrics.sentence import REPEAT_N, SentenceScorer, SentenceScores, repeated_ngrams, summary
from nat_kd.analysis.tokenizers import Tokenizer13a
from nat_kd.artifacts import DistilledSet
from nat_kd.atomic import write_json, write_text
from nat_kd.corpus import CorpusError, read_lines

EXAMPLES = 10
TOP = 10  # repeated n-grams and identical outputs listed
LISTED_LINES = 10  # empty/truncated line numbers listed (the counts are complete)
FLAGS = ("repeated", "replaced")  # scores.tsv's 0/1 columns: the summary gives their share, a histogram no more
HISTOGRAM_PERCENTILE = 99.5  # the histograms' axes end at this percentile (and start at 100 minus it)


def _lines_field(numbers: list[int]) -> dict:
    return {"count": len(numbers), "first": numbers[:LISTED_LINES]}


def repeated_outputs(target: list[str], scores: SentenceScores, reference: list[str] | None,
                     n: int = REPEAT_N) -> dict:
    """The lines flagged for a repeated n-gram: their count and share (and the references' share, for
    comparison), the n-grams most often repeated (counted once per line), and the most frequent identical
    outputs of the whole set."""
    tokenizer = Tokenizer13a(lowercase=True)
    flagged = np.flatnonzero(scores["repeated"] > 0)
    ngrams = Counter()
    for i in flagged.tolist():
        words = tokenizer(target[i]).split()
        seen = Counter(tuple(words[k:k + n]) for k in range(len(words) - n + 1))
        ngrams.update(" ".join(g) for g, c in seen.items() if c > 1)
    identical = [(line, count) for line, count in Counter(target).most_common(TOP) if count > 1]
    reference_share = float((repeated_ngrams(reference, n, tokenizer) > 0).mean()) if reference else None
    return {"n": n, "lines": int(len(flagged)), "share": len(flagged) / max(1, len(target)),
            "reference_share": reference_share,
            "most_repeated_ngrams": ngrams.most_common(TOP), "most_frequent_outputs": identical}


def build_card(meta: dict, *, source: list[str], reference: list[str] | None, target: list[str],
               scores: SentenceScores, analysis: dict | None = None, teacher_valid_bleu: float | None = None,
               seed: int = 1) -> dict:
    """The card's content as a dict (card.json) from the set's meta.json, texts and per-line scores."""
    teacher = meta.get("teacher", {})
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(len(target), size=min(EXAMPLES, len(target)), replace=False).tolist())
    return {
        "name": meta.get("name"), "nat_kd_version": __version__,
        "teacher": {"name": teacher.get("name"), "checkpoints": teacher.get("checkpoints"),
                    "sha256": teacher.get("sha256"), "architecture": teacher.get("arch"),
                    "parameters": teacher.get("parameters"), "converter": teacher.get("converter"),
                    "converter_version": teacher.get("converter_version"), "validation_bleu": teacher_valid_bleu},
        "student_vocabulary": _student_vocabulary(meta.get("student_vocabulary")),
        # what the targets depend on; not batching or sharding, so a sharded run's card is an unsharded one's
        "decoding": {"backend": meta.get("backend", {"name": "fairseq"}), "strategy": meta.get("strategy"),
                     "settings": meta.get("settings")},
        "lines": {"sentences": len(target), "empty_source_lines": _lines_field(meta.get("empty_source_lines", [])),
                  "truncated_source_lines": _lines_field(meta.get("truncated_source_lines", [])),
                  "empty_outputs": sum(1 for t in target if not t.strip())},
        "scores_vs_reference": meta.get("scores"),
        "analysis": analysis,
        "sentence_scores": {"file": "scores.tsv", "settings": scores.settings, "summary": summary(scores)},
        "repeated": repeated_outputs(target, scores, reference),
        "mix": meta.get("mix"),
        "examples": {"seed": seed, "lines": [
            {"line": i + 1, "source": source[i], "reference": reference[i] if reference else None,
             "distilled": target[i]} for i in picked]},
    }


def _student_vocabulary(recorded: dict | None) -> dict | None:
    """meta.json's student_vocabulary: the share of target tokens that are <unk> in the student's dictionary,
    flagged above its warning share."""
    if not recorded:
        return None
    share = recorded["target"]["unk_share"]
    return {"dictionaries": recorded["dictionaries"], "target_tokens": recorded["target"]["tokens"],
            "target_unk": recorded["target"]["unk"], "target_unk_share": share,
            "source_unk_share": recorded["source"]["unk_share"], "warning": share > recorded["unk_warning_share"]}


def _number(value, spec=".4f") -> str:
    return markdown.cell(value if not isinstance(value, float) or not math.isinf(value) else None, spec)


def card_markdown(card: dict, figure_name: str) -> str:
    return "\n".join([f"# Dataset card: {card['name']}", "",
                      f"Written by nat_kd {card['nat_kd_version']}. Per-line scores: "
                      f"`{card['sentence_scores']['file']}`.", "",
                      *_teacher_markdown(card), *_decoding_markdown(card), *_analysis_markdown(card["analysis"]),
                      *_scores_markdown(card, figure_name), *_repeated_markdown(card), *_mix_markdown(card),
                      *_examples_markdown(card)])


def _teacher_markdown(card: dict) -> list[str]:
    """The teacher, and the student's vocabulary where bin/ is in it."""
    t = card["teacher"]
    out = ["## Teacher", ""]
    checkpoints = t["checkpoints"] or ["-"]
    hashes, archs = t["sha256"] or ["-"] * len(checkpoints), t["architecture"] or ["-"] * len(checkpoints)
    out.append(markdown.table(
        ["checkpoint", "sha256", "architecture", "parameters", "validation BLEU"],
        [[c, h[:16], a, markdown.cell(t["parameters"], ",") if i == 0 else "",
          markdown.cell(t["validation_bleu"], ".2f") if i == 0 else ""]
         for i, (c, h, a) in enumerate(zip(checkpoints, hashes, archs))]))
    if t["validation_bleu"] is None:
        out.append("Validation BLEU: not known (give it with "
                   "`python -m nat_kd.analyze card DIR --teacher-valid-bleu B`).\n")
    if t.get("converter"):
        out.append(f"Teacher `{t['name']}`, converted to CTranslate2 by `{t['converter']}` "
                   f"{t['converter_version']}.\n")
    student = card.get("student_vocabulary")
    if student:
        out += ["## Student vocabulary", "",
                f"bin/ is in the student's tokens and dictionaries ({student['dictionaries']}): "
                f"{student['target_unk']} of {student['target_tokens']} target tokens "
                f"({100 * student['target_unk_share']:.2f}%) are `<unk>` there, "
                f"{100 * student['source_unk_share']:.2f}% of the source tokens."
                + (" **Warning: the student's vocabulary misses much of what the teacher writes.**"
                   if student["warning"] else ""), ""]
    return out


def _decoding_markdown(card: dict) -> list[str]:
    """How the set was decoded, its lines, and its scores against the references."""
    d, lines = card["decoding"], card["lines"]
    backend = ", ".join(f"{k}={v}" for k, v in d["backend"].items() if k != "name")
    settings = ", ".join(f"{k}={v}" for k, v in (d["settings"] or {}).items() if k != "name")
    # no strategy: the backend decodes its own way (backends/base.py's ``strategies``)
    out = ["## Decoding", "", f"Backend `{d['backend']['name']}`" + (f" ({backend})" if backend else "")
           + (f", strategy `{d['strategy']}`: {settings}." if d["strategy"] else ", which decodes its own way: no "
              "strategy, no decoding settings."), ""]
    out += ["## Lines", "", markdown.table(["sentences", "empty source lines", "truncated source lines",
                                            "empty outputs"],
                                           [[lines["sentences"], _line_list(lines["empty_source_lines"]),
                                             _line_list(lines["truncated_source_lines"]), lines["empty_outputs"]]])]
    ref = card["scores_vs_reference"] or {}
    if ref:
        out += ["## Against the references", "",
                f"BLEU {ref['bleu']:.2f} (`{ref['bleu_signature']}`), "
                f"chrF {ref['chrf']:.2f} (`{ref['chrf_signature']}`), length ratio "
                f"{ref['length_ratio_corpus']:.3f} (corpus), {ref['mean_length_ratio']:.3f} (mean per line).",
                ""]
    return out


def _scores_markdown(card: dict, figure_name: str) -> list[str]:
    return ["## Per-line scores", "", markdown.table(
        ["score", "lines", "mean", "10%", "25%", "median", "75%", "90%"],
        [[name, s["lines"], _number(s["mean"]), *(_number(s[q]) for q in ("q10", "q25", "q50", "q75", "q90"))]
         for name, s in card["sentence_scores"]["summary"].items()]),
        "Settings: " + "; ".join(f"{k}: `{v}`" for k, v in card["sentence_scores"]["settings"].items()) + "\n",
        f"![per-line scores]({figure_name})", "",
        f"Each histogram's axis spans the {100 - HISTOGRAM_PERCENTILE:g}th to {HISTOGRAM_PERCENTILE:g}th percentile "
        "of its lines; the title counts the lines off the axis (the repeated n-gram counts are drawn whole, on a log "
        "scale).", ""]


def _repeated_markdown(card: dict) -> list[str]:
    rep = card["repeated"]
    out = ["## Repeated outputs", "",
           f"{rep['lines']} of {card['lines']['sentences']} outputs ({100 * rep['share']:.2f}%) repeat a "
           f"{rep['n']}-gram (13a tokens, lowercased)" + (f"; {100 * rep['reference_share']:.2f}% of the references do."
                                                          if rep["reference_share"] is not None else "."), ""]
    if rep["most_repeated_ngrams"]:
        out.append(markdown.table([f"repeated {rep['n']}-gram", "outputs"], rep["most_repeated_ngrams"]))
    if rep["most_frequent_outputs"]:
        out.append(markdown.table(["most frequent identical output", "times"], rep["most_frequent_outputs"]))
    return out


def _mix_markdown(card: dict) -> list[str]:
    mix = card.get("mix")
    if not mix:
        return []
    return ["## Mixing", "", f"Rule: `{mix['rule']}`. {mix['replaced']} of {mix['lines']} lines take the real "
            f"target, {mix['lines'] - mix['replaced']} the distilled one (from `{mix['distilled']}`).", ""]


def _examples_markdown(card: dict) -> list[str]:
    return [f"## Examples (seed {card['examples']['seed']})", "",
            markdown.table(["line", "source", "reference", "distilled"],
                           [[e["line"], _escape(e["source"]), _escape(e["reference"] or "-"), _escape(e["distilled"])]
                            for e in card["examples"]["lines"]])]


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _line_list(field: dict) -> str:
    if not field["count"]:
        return "0"
    more = ", ..." if field["count"] > len(field["first"]) else ""
    return f"{field['count']} (lines {', '.join(map(str, field['first']))}{more})"


def card_analysis(row: dict, real_row: dict, signatures: dict) -> dict:
    """card.json's ``analysis`` from a set's row of the analysis report and the real data's: the measures the
    card shows (the real data's own where it is not measured against itself), both frequency-bucket tables, and
    the measures' signatures."""
    measures = [measure for measure, _ in shown(CARD) if measure.name in row]
    return {**{m.name: row[m.name] for m in measures}, "frequency_buckets": row["frequency_buckets"],
            "real": {"name": real_row["name"], **{m.name: real_row[m.name] for m in measures if not m.relative},
                     "frequency_buckets": real_row["frequency_buckets"]},
            "signatures": signatures}


def _analysis_markdown(analysis: dict | None) -> list[str]:
    if not analysis:
        return ["## Data measures", "", "C(d), F(d) and FRS need the corpus aligned: not measured yet. Run "
                "`python -m nat_kd.analyze report --set-dir DIR --out OUT` to add them here.", ""]
    columns, real = shown(CARD), analysis["real"]
    out = ["## Data measures", "", markdown.table(
        ["set", *(column.label for _, column in columns)],
        [[real["name"], *("-" if m.relative else _number(real.get(m.name), c.format) for m, c in columns)],
         ["this set", *(_number(analysis.get(m.name), c.format) for m, c in columns)]]),
        "Signatures: " + "; ".join(f"`{s}`" for s in analysis["signatures"].values()) + "\n"]
    out += ["### Source words by frequency in the real data", "", frequency_markdown(
        [(real["name"], real["frequency_buckets"]), ("this set", analysis["frequency_buckets"])])]
    return out


def frequency_markdown(sets: list[tuple[str, list[dict]]]) -> str:
    """The frequency-bucket table of one or more sets (rows of ``frequency.BucketRow.as_dict``)."""
    return markdown.table(
        ["set", "source count", "words", "C(d)", "real linked pairs", "kept", "words losing every translation"],
        [[name, b["bucket"], b["words"], _number(b["complexity"]), b["real_pairs"], _number(b["kept"], ".3f"),
          b["words_losing_all"]] for name, buckets in sets for b in buckets])


def histogram_axis(values: np.ndarray) -> tuple[float, float, int]:
    """The x range of a score's histogram, between the (100 - HISTOGRAM_PERCENTILE)th and HISTOGRAM_PERCENTILEth
    percentiles, and how many lines fall off it: one line at length ratio 17 would otherwise set the axis and
    leave every other line in one bar."""
    if not len(values):
        return 0.0, 1.0, 0
    low, high = np.percentile(values, [100 - HISTOGRAM_PERCENTILE, HISTOGRAM_PERCENTILE])
    return float(low), float(high), int(((values < low) | (values > high)).sum())


def histogram_columns(scores: SentenceScores) -> list[str]:
    """The columns the card's figure draws: every one of scores.tsv's but the 0/1 flags, in its order (a measure's
    per-line form among them), the repeated n-gram counts last."""
    names = [n for n in scores.columns if n not in (*FLAGS, "repeated_ngrams")]
    return names + ["repeated_ngrams"] * ("repeated_ngrams" in scores.columns)


def plot_scores(scores: SentenceScores, path) -> None:
    from nat_kd.analysis.plotting import plt, save_figure  # first: it quiets matplotlib's logger, then imports it
    from matplotlib.ticker import FuncFormatter

    names = histogram_columns(scores)
    fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 2.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        values = scores[name][~np.isnan(scores[name])]
        if name == "repeated_ngrams":  # counts: one bar per value, and a log scale for the rare long loops
            counts, edges = np.histogram(values, bins=np.arange(0, max(values.max(initial=0), 1) + 2) - 0.5)
            ax.set_yscale("log")
            # plain numbers: the log axis's default labels are mathtext ("10^2"), parsed afresh for each figure
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            title = name
        else:
            low, high, outside = histogram_axis(values)
            counts, edges = np.histogram(values, bins=30, range=(low, high) if high > low else None)
            title = name + (f"\n({outside} lines off the axis)" if outside else "")
        # one filled outline per panel: ax.hist's bar per bin is an artist each, to place and draw; on the log
        # scale the fill starts below a count of 1, as a log axis has no 0
        ax.stairs(counts, edges, fill=True, baseline=0.5 if name == "repeated_ngrams" else 0)
        # y given: matplotlib would otherwise measure the x axis's labels to keep the title clear of them
        ax.set_title(title, fontsize=9, y=1.0)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("lines")
    # margins in inches, fixed: every panel holds the same kinds of labels, so measuring them (tight_layout, a
    # tight bounding box) would draw the figure twice more for the same layout, most of a card's time
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.1 / width, bottom=0.35 / height, top=1 - 0.42 / height,
                        wspace=0.3)
    save_figure(fig, path, tight=False)


def write_card(distilled: DistilledSet, card: dict, scores: SentenceScores) -> None:
    """card.json, CARD.md and the figure into ``distilled``'s folder, each written atomically."""
    plot_scores(scores, distilled.card_figure)
    write_json(distilled.card_json, card)
    write_text(distilled.card_markdown, card_markdown(card, distilled.card_figure.name))


def refresh_card(directory: str | Path, *, reference: str | Path | None = None, analysis: dict | None = None,
                 line_scores: dict[str, np.ndarray] | None = None,
                 teacher_valid_bleu: float | None = None) -> DistilledSet:
    """Rewrite a set's card (and scores.tsv, with ``line_scores``' columns: the report's per-line measures) from
    its files; what is not given (``analysis``, the teacher's validation BLEU) is kept from the card already
    there. The set's scores.tsv is computed from the texts if missing (without the teacher's log-probability)."""
    distilled = DistilledSet(directory)
    meta = distilled.meta()
    if meta is None:
        raise CorpusError(f"{distilled.root} has no meta.json: a card describes a set written by "
                          "nat_kd.generate_distilled or nat_kd.mix")
    files = meta["files"]
    source, target = read_lines(distilled.root / files["source"]), read_lines(distilled.root / files["target"])
    reference_file = reference or meta.get("corpus", {}).get("reference")
    references = read_lines(reference_file) if reference_file else None
    repeats = distilled.real_repeats()  # a union set's lines pair with the real targets once for each set in it
    if references is not None and len(references) * repeats != len(target):
        union = f" ({repeats} times over: a union of {repeats} sets)" if repeats > 1 else ""
        raise CorpusError(f"line-count mismatch: {reference_file} has {len(references)} lines but "
                          f"{distilled.root / files['target']} has {len(target)}{union}; pass the set's own references")
    references = references * repeats if references is not None else None
    if distilled.scores_file.is_file():
        scores = SentenceScores.read(distilled.scores_file)
        scores.settings = SentenceScorer().settings
    else:
        scores = SentenceScorer().score(target, references)
    for name, values in (line_scores or {}).items():
        scores = scores.with_column(name, values)
    if line_scores or not distilled.scores_file.is_file():
        scores.write(distilled.scores_file)
    previous = json.loads(distilled.card_json.read_text(encoding="utf-8")) if distilled.card_json.is_file() else {}
    card = build_card(meta, source=source, reference=references, target=target, scores=scores,
                      analysis=analysis or previous.get("analysis"),
                      teacher_valid_bleu=teacher_valid_bleu if teacher_valid_bleu is not None
                      else previous.get("teacher", {}).get("validation_bleu"))
    write_card(distilled, card, scores)
    return distilled
