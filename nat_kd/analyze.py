"""Command line: ``python -m nat_kd.analyze {align,complexity,faithfulness,reordering,modes,sentences,card,report}``.

The face of the analysis package (nat_kd/analysis: aligner, formats, tokenizers, metrics, report); see
docs/analysis.md.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from nat_kd.analysis.align import AlignerOptions
from nat_kd.analysis.formats import format_alignments, format_table, iter_parallel_tokens, read_alignments, read_table
from nat_kd.atomic import check_output_file, write_text, writing
from nat_kd.cli import add_verbose_argument, cleaning_up_on_sigterm, run, setup_logging
from nat_kd.corpus import CorpusError, data_dir, iter_lines, read_lines, split_file
from nat_kd.errors import SettingsError
from nat_kd.analysis.metrics import Complexity, Faithfulness, Modes, Reordering, UnigramModels, align_corpus
from nat_kd.analysis.metrics.base import ALIGNERS, align_line_pairs, parallel_lines
from nat_kd.analysis.metrics.faithfulness import DEFAULT_FLOOR
from nat_kd.analysis.metrics.frequency import DEFAULT_BUCKETS
from nat_kd.analysis.metrics.reordering import CONVENTION_RULES, SKIPPED
from nat_kd.analysis.tokenizers import TOKENIZERS, get_tokenizer


# ------------------------------------------------------------------ shared flags

def add_tokenizer_flags(parser):
    group = parser.add_argument_group("tokenisation")
    # no default value, so that an input read without a tokeniser (-i) can tell a --tok given from none
    group.add_argument("--tok", choices=TOKENIZERS,
                       help="sacrebleu's 13a (default), none (text already tokenised), spm (sentencepiece)")
    group.add_argument("--spm-model", help="sentencepiece .model file for --tok spm")
    group.add_argument("--lowercase", "-lc", action=argparse.BooleanOptionalAction, default=True,
                       help="lowercase before tokenising (default: yes)")


def add_aligner_flags(parser, recommended: bool):
    """fast_align's flags. Analysis commands default to its '[USE]' settings -d -o -v; ``align`` to none."""
    group = parser.add_argument_group("aligner (fast_align options)")
    group.add_argument("--aligner", choices=ALIGNERS, default="builtin",
                       help="builtin numpy model (default) or a fast_align executable on PATH")
    group.add_argument("-d", "--favor-diagonal", action=argparse.BooleanOptionalAction, default=recommended)
    group.add_argument("-o", "--optimize-tension", action=argparse.BooleanOptionalAction, default=recommended)
    group.add_argument("-v", "--variational-bayes", action=argparse.BooleanOptionalAction, default=recommended)
    group.add_argument("-a", "--alpha", type=float, default=0.01, help="Dirichlet prior alpha for -v")
    group.add_argument("-I", "--iterations", type=int, default=5)
    group.add_argument("-T", "--diagonal-tension", type=float,
                       help="initial tension (default 4); like fast_align, giving it implies -d")
    group.add_argument("-q", "--p-null", type=float, default=0.08, help="NULL alignment probability")
    group.add_argument("-N", "--no-null-word", action="store_true")
    group.add_argument("-r", "--reverse", action="store_true", help="align target to source")
    group.add_argument("-t", "--beam-threshold", type=float, default=-4.0,
                       help="table export keeps p >= max_p ** -t within each row")
    group.add_argument("--drop-empty", action="store_true",
                       help="drop pairs with an empty side instead of stopping with an error")


def aligner_options(args) -> AlignerOptions:
    given_tension = args.diagonal_tension is not None
    return AlignerOptions(iterations=args.iterations, favor_diagonal=args.favor_diagonal or given_tension,
                          optimize_tension=args.optimize_tension, variational_bayes=args.variational_bayes,
                          alpha=args.alpha, diagonal_tension=args.diagonal_tension if given_tension else 4.0,
                          p_null=args.p_null,
                          no_null_word=args.no_null_word, reverse=args.reverse, beam_threshold=args.beam_threshold)


def add_text_inputs(parser, prefix: str = "", required: bool = False):
    flag = prefix.replace("_", "-")
    parser.add_argument(f"--{flag}src", dest=f"{prefix}src", help="raw source text, one sentence a line (.gz ok)")
    parser.add_argument(f"--{flag}tgt", dest=f"{prefix}tgt", help="raw target text, line-aligned with the source")
    if not prefix:
        parser.add_argument("-i", "--input", help="pre-tokenised fast_align input 'src ||| tgt' (implies --tok none)")


def aligned_from_args(args, prefix: str = "", links: bool = True):
    """Tokenise and align the text the arguments name, streaming it from disk (``links``: see align_corpus)."""
    options = aligner_options(args)
    src_file, tgt_file = getattr(args, f"{prefix}src"), getattr(args, f"{prefix}tgt")
    if not prefix and getattr(args, "input", None):
        given = [flag for flag, value in (("--src", src_file), ("--tgt", tgt_file), ("--tok", args.tok),
                                          ("--spm-model", args.spm_model)) if value]
        if given:
            raise SettingsError(f"-i {args.input} is already tokenised text (fast_align's 'src ||| tgt', read as "
                                f"--tok none): drop {' and '.join(given)}, or pass --src and --tgt instead of -i")
        lines = ((" ".join(s), " ".join(t)) for s, t in iter_parallel_tokens(args.input))
        return align_line_pairs(lines, get_tokenizer("none", args.lowercase), options, args.aligner,
                                (args.input, args.input), args.drop_empty, links)
    if src_file and tgt_file:
        return align_corpus(iter_lines(src_file), iter_lines(tgt_file),
                            get_tokenizer(args.tok, args.lowercase, args.spm_model), options, args.aligner,
                            (src_file, tgt_file), args.drop_empty, links)
    flag = "--src/--tgt or -i" if not prefix else f"--{prefix.replace('_', '-')}src and --{prefix.replace('_', '-')}tgt"
    raise CorpusError(f"no input: pass {flag}")


def emit_json(path, payload):
    if path:
        write_text(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------ subcommands

def cmd_align(args):
    aligned = aligned_from_args(args)
    if args.alignments:
        with writing(args.alignments) as out:
            for shard in aligned.result.alignment_shards():
                out.write(format_alignments(shard))
    else:
        for shard in aligned.result.alignment_shards():
            sys.stdout.write(format_alignments(shard))
    if args.p:
        write_text(args.p, format_table(aligned.result.exported_table()))
    if args.log:
        write_text(args.log, aligned.result.format_log())
    print(f"aligned {aligned.pairs} pairs | {aligned.settings}", file=sys.stderr)


def cmd_complexity(args):
    metric = Complexity(args.log_base)
    if args.table:
        score = metric.table_score(read_table(args.table), {"table": args.table})
    else:
        aligned = aligned_from_args(args, links=False)
        score = metric.table_score(aligned.result.exported_table(), aligned.settings)
    print(score.format())
    if args.top:
        print("most uncertain: " + ", ".join(f"{w} {h:.3f}" for w, h in score.most_uncertain(args.top)))
        print("least uncertain: " + ", ".join(f"{w} {h:.3f}" for w, h in score.least_uncertain(args.top)))
    emit_json(args.json, {"score": score.score, "vocab_size": score.vocab_size, "unit": score.unit,
                          "most_uncertain": score.most_uncertain(args.top or 10),
                          "least_uncertain": score.least_uncertain(args.top or 10),
                          "signature": str(score.signature)})


def cmd_faithfulness(args):
    metric = Faithfulness(args.log_base, args.floor)
    if args.real_table and args.distilled_table:
        score = metric.table_score(read_table(args.real_table), read_table(args.distilled_table),
                                   {"tables": f"{args.real_table},{args.distilled_table}"})
    else:
        real = aligned_from_args(args, "real_", links=False)
        distilled = aligned_from_args(args, "distilled_", links=False)
        score = metric.table_score(real.result.exported_table(), distilled.result.exported_table(), real.settings)
    print(score.format())
    emit_json(args.json, {"score": score.score, "vocab_size": score.vocab_size,
                          "missing_words": score.missing_words, "signature": str(score.signature)})


def cmd_reordering(args):
    metric = Reordering(args.frs_convention)
    if args.alignments:
        score = metric.corpus_score(read_alignments(args.alignments), {"alignments": args.alignments})
    else:
        aligned = aligned_from_args(args)
        score = metric.corpus_score(aligned.result.alignment_shards(), aligned.settings)
    if math.isnan(score.score):
        given = args.alignments or " and ".join(filter(None, (args.input, args.src, args.tgt)))
        raise CorpusError(f"{given}: FRS is undefined, every one of its {score.skipped} sentences is skipped "
                          f"({SKIPPED[args.frs_convention]}); check the links")
    print(score.format())
    if args.per_sentence:
        write_text(args.per_sentence, "".join("nan\n" if np.isnan(s) else f"{s:.6f}\n" for s in score.sentences))
    emit_json(args.json, {"score": score.score, "sentences": len(score.sentences), "skipped": score.skipped,
                          "signature": str(score.signature)})


def parse_pairs(items, what):
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not (key and eq and value):
            raise CorpusError(f"{what} {item!r}: expected LANG=VALUE")
        out[key] = value
    return out


def cmd_modes(args):
    tokenizer = get_tokenizer(args.tok, args.lowercase, args.spm_model)
    texts = {lang: tokenizer.corpus(read_lines(path)) for lang, path in parse_pairs(args.lang, "--lang").items()}
    if len(texts) < 2:
        raise CorpusError("--lang: give at least two languages, e.g. --lang de=train.de --lang fr=train.fr")
    prior = {k: float(v) for k, v in parse_pairs(args.prior, "--prior").items()}
    score = Modes(UnigramModels.from_texts(texts, prior)).corpus_score(
        tokenizer.corpus(read_lines(args.outputs)), tokenizer.settings)
    if score.unknown == len(score.posteriors):
        raise CorpusError(f"{args.outputs}: no line has a token that a --lang text holds, so there is no mode mix; "
                          "give texts in the outputs' languages, tokenised alike (--tok)")
    print(score.format())
    print("argmax share: " + ", ".join(f"{k}={v:.3f}" for k, v in score.argmax_share.items()))
    emit_json(args.json, {"mean_purity": score.mean_purity, "mix": score.mix, "argmax_share": score.argmax_share,
                          "unknown": score.unknown, "signature": str(score.signature)})


def cmd_report(args):
    from nat_kd.analysis.report import AnalysisReport, DataSet, set_from_arg, set_from_dir

    for given, missing in (("src", "tgt"), ("tgt", "src")):
        if getattr(args, f"real_{given}") and not getattr(args, f"real_{missing}"):
            raise SettingsError(f"--real-{given} needs --real-{missing}: pass both, or neither for the "
                                "Multi30k data in --data-dir")
    tokenizer = get_tokenizer(args.tok, args.lowercase, args.spm_model)
    if args.real_src:
        real = DataSet(args.real_name, Path(args.real_src), Path(args.real_tgt))
    else:
        directory = data_dir(args.data_dir)
        real = DataSet(args.real_name, split_file(directory, args.split or "train", args.src_lang),
                       split_file(directory, args.split or "train", args.tgt_lang))
    sets = [set_from_arg(s) for s in args.set or []]
    sets += [set_from_dir(d, args.split, args.src_lang, args.tgt_lang) for d in args.set_dir or []]
    mode_texts = {lang: read_lines(path) for lang, path in parse_pairs(args.lang, "--lang").items()}
    report = AnalysisReport(tokenizer, aligner_options(args), args.aligner, args.log_base, args.floor, mode_texts,
                            args.drop_empty, args.buckets).run(real, sets)
    paths = report.write(args.out)
    sys.stdout.write(report.to_markdown())
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    if not args.no_cards:
        for directory in report.refresh_cards(real, sets):
            print(f"refreshed {directory}/CARD.md, card.json and scores.tsv", file=sys.stderr)


def _blocks(lines: Iterator, size: int) -> Iterator[list]:
    """``lines`` in lists of ``size``; the first may be empty (no lines: a file still gets its header)."""
    block = list(itertools.islice(lines, size))
    yield block
    while block := list(itertools.islice(lines, size)):
        yield block


def cmd_sentences(args):
    from nat_kd.analysis.metrics.reordering import line_scores
    from nat_kd.analysis.metrics.sentence import SCORE_BLOCK, SentenceScorer, SentenceScores, summary

    tokenizer = get_tokenizer(args.tok, args.lowercase, args.spm_model)
    frs = None
    if args.src:
        aligned = align_corpus(iter_lines(args.src), iter_lines(args.hyp), tokenizer, aligner_options(args),
                               args.aligner, (args.src, args.hyp), args.drop_empty)
        frs = line_scores(aligned)
    # a block of lines at a time: memory holds one block's text and sacrebleu statistics, and each line's
    # few numbers (the summary's medians need them all)
    lines = (parallel_lines(iter_lines(args.hyp), iter_lines(args.ref), (args.hyp, args.ref)) if args.ref
             else ((line, None) for line in iter_lines(args.hyp)))
    scorer, parts, done = SentenceScorer(args.repeat_n), [], 0
    with writing(args.out) as out:
        for block in _blocks(lines, SCORE_BLOCK):
            scores = scorer.score([hyp for hyp, _ in block], [ref for _, ref in block] if args.ref else None)
            if frs is not None:
                scores = scores.with_column("frs", frs[done:done + len(block)])
            out.writelines(scores.tsv_lines(done + 1, header=not done))
            parts.append(scores.columns)
            done += len(block)
    scores = SentenceScores({name: np.concatenate([part[name] for part in parts]) for name in parts[0]})
    for name, stats in summary(scores).items():
        print(f"{name}: mean {stats['mean']:.4f} median {stats['q50']:.4f} over {stats['lines']} lines")
    print(f"wrote {args.out}", file=sys.stderr)


def cmd_card(args):
    from nat_kd.analysis.card import refresh_card

    distilled = refresh_card(args.set_dir, reference=args.reference, teacher_valid_bleu=args.teacher_valid_bleu)
    print(f"wrote {distilled.card_markdown}, {distilled.card_json.name}, {distilled.card_figure.name}", file=sys.stderr)


# ------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nat-kd-analyze", description=__doc__.splitlines()[0])
    add_verbose_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("align", help="fast_align-compatible word alignment (Pharaoh links, -p table)")
    add_text_inputs(p)
    add_tokenizer_flags(p)
    add_aligner_flags(p, recommended=False)
    p.add_argument("--alignments", help="write Pharaoh links here (default: stdout)")
    p.add_argument("-p", help="write the conditional probability table here, as fast_align -p")
    p.add_argument("--log", help="write the per-iteration training trace here, in fast_align's stderr format")
    p.set_defaults(func=cmd_align)

    p = sub.add_parser("complexity", help="C(d): mean entropy of the source words' translation distributions")
    add_text_inputs(p)
    p.add_argument("--table", help="a ready fast_align -p table instead of text")
    add_tokenizer_flags(p)
    add_aligner_flags(p, recommended=True)
    p.add_argument("-b", "--log-base", choices=("e", "2"), default="e", help="e: nats (default), 2: bits")
    p.add_argument("--top", type=int, default=10, help="list the K most and least uncertain source words")
    p.add_argument("--json", help="also write the result as JSON here")
    p.set_defaults(func=cmd_complexity)

    p = sub.add_parser("faithfulness", help="F(d): mean KL(p_real(.|x) || p_distilled(.|x))")
    add_text_inputs(p, "real_")
    add_text_inputs(p, "distilled_")
    p.add_argument("--real-table", help="ready fast_align -p table of the real data")
    p.add_argument("--distilled-table", help="ready fast_align -p table of the distilled data")
    add_tokenizer_flags(p)
    add_aligner_flags(p, recommended=True)
    p.add_argument("-b", "--log-base", choices=("e", "2"), default="e")
    p.add_argument("--floor", type=float, default=DEFAULT_FLOOR,
                   help="probability given to translations the distilled table lacks (default 1e-9)")
    p.add_argument("--json")
    p.set_defaults(func=cmd_faithfulness)

    p = sub.add_parser("reordering", help="fuzzy reordering score (Talbot et al. 2011)")
    add_text_inputs(p)
    p.add_argument("--alignments", help="a ready Pharaoh alignment file (source-target) instead of text")
    add_tokenizer_flags(p)
    add_aligner_flags(p, recommended=True)
    p.add_argument("--per-sentence", help="write each sentence's score here, one a line")
    p.add_argument("--frs-convention", choices=tuple(CONVENTION_RULES), default="chunks",
                   help="chunks: 1-(C-1)/(M-1), sentences with < 2 aligned words skipped (default); boundary: "
                   "google/topdown-btg-preordering's, with sentence-boundary markers, 1-D/(M+1) (docs/analysis.md)")
    p.add_argument("--json")
    p.set_defaults(func=cmd_reordering)

    p = sub.add_parser("modes", help="language posteriors p(l|y) of outputs under per-language unigram models")
    p.add_argument("outputs", help="output sentences, one a line")
    p.add_argument("--lang", action="append", metavar="LANG=FILE", help="text of one mode (repeat)")
    p.add_argument("--prior", action="append", metavar="LANG=P", help="prior p(l) (default uniform)")
    add_tokenizer_flags(p)
    p.add_argument("--json")
    p.set_defaults(func=cmd_modes)

    p = sub.add_parser("sentences", help="per-line scores of any target file against its references (scores.tsv)")
    p.add_argument("--hyp", required=True, help="the targets to score (e.g. a distilled set's SPLIT.TGT)")
    p.add_argument("--ref", help="their references, line-aligned (sentence BLEU, chrF, length ratio)")
    p.add_argument("--src", help="the sources, line-aligned: adds each line's FRS (aligns --src with --hyp)")
    p.add_argument("--repeat-n", type=int, default=2, help="n of the repeated n-gram count (default 2)")
    p.add_argument("--out", required=True, help="where to write the TSV")
    add_tokenizer_flags(p)
    add_aligner_flags(p, recommended=True)
    p.set_defaults(func=cmd_sentences)

    p = sub.add_parser("card", help="rewrite a distilled set's CARD.md, card.json and figure from its files")
    p.add_argument("set_dir", help="the distilled set folder (with meta.json)")
    p.add_argument("--reference", help="its references (default: the file recorded in meta.json)")
    p.add_argument("--teacher-valid-bleu", type=float, help="the teacher's validation BLEU, for the card")
    p.set_defaults(func=cmd_card)

    p = sub.add_parser("report", help="table + figures: real data versus distilled sets")
    p.add_argument("--real-src", help="real source text (default: DATA_DIR/SPLIT.SRC_LANG)")
    p.add_argument("--real-tgt", help="real target text (default: DATA_DIR/SPLIT.TGT_LANG)")
    p.add_argument("--real-name", default="real")
    p.add_argument("--data-dir", help="Multi30k raw folder (default: $NAT_KD_DATA or ../shared/data/multi30k)")
    p.add_argument("--split", help="split of the real data in --data-dir (default: train); a --set-dir is read "
                   "from the files its meta.json names, whatever its split")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--set", action="append", metavar="NAME=SRC_FILE,TGT_FILE", help="a distilled set (repeat)")
    p.add_argument("--set-dir", action="append", metavar="DIR",
                   help="a distilled set directory with SPLIT.SRC_LANG, SPLIT.TGT_LANG, optional meta.json")
    p.add_argument("--lang", action="append", metavar="LANG=FILE",
                   help="per-language texts for the mode-mix diagnostic (repeat; optional)")
    p.add_argument("--out", required=True, help="folder for report.md, report.json and the figures")
    p.add_argument("--buckets", type=lambda text: [int(x) for x in text.split(",")], default=list(DEFAULT_BUCKETS),
                   metavar="1,2,5,20", help="lower edges of the source-word frequency buckets (default 1,2,5,20)")
    p.add_argument("--no-cards", action="store_true",
                   help="leave the --set-dir folders alone (default: refresh their card and scores.tsv)")
    add_tokenizer_flags(p)
    add_aligner_flags(p, recommended=True)
    p.add_argument("-b", "--log-base", choices=("e", "2"), default="e")
    p.add_argument("--floor", type=float, default=DEFAULT_FLOOR)
    p.set_defaults(func=cmd_report)
    return parser


# Each command's output files (report's --out is a folder), checked before its computation: a path that
# cannot be written to fails at once instead of after it
OUTPUT_FILES = {"align": ("alignments", "p", "log"), "complexity": ("json",), "faithfulness": ("json",),
                "reordering": ("per_sentence", "json"), "modes": ("json",), "sentences": ("out",)}


def check_outputs(args) -> None:
    for name in OUTPUT_FILES.get(args.command, ()):
        if getattr(args, name):
            check_output_file(getattr(args, name))
    if args.command == "report":
        from nat_kd.analysis.report import check_report_folder

        check_report_folder(args.out)


def main(argv: list[str] | None = None) -> int:
    setup_logging(argv)
    args = build_parser().parse_args(argv)

    def body():
        with cleaning_up_on_sigterm():  # every output is written through a temporary: none is left behind
            check_outputs(args)
            return args.func(args)

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
