"""Re-decode a corpus with a teacher into a distilled training set (sequence-level KD).

    python -m nat_kd.generate_distilled --teacher-path runs/multi30k.en-de/teacher_tiny/checkpoint_best.pt \\
        --prepared data/multi30k.en-de.spm8000 --split train --strategy beam --beam 5 \\
        --out runs/multi30k.en-de/distill/beam5

Teacher: --teacher-path A.pt[:B.pt...] (several make an ensemble), with --teacher-data DIR if its dictionaries
are not in the data folder recorded in the checkpoint (the same options as the word_kd criteria and
nat_kd.teacher_topk; --teacher A.pt [B.pt ...] and --dict-dir still work, deprecated).
Corpus: --prepared DIR (nat_kd.prepare output: bin/, raw/, spm.model), or --data BIN (any fairseq-binarized
folder) or --source FILE (raw text); --reference FILE (raw), else the references are --data's target side.
Text <-> the teacher's tokens: fairseq's --bpe/--tokenizer/--post-process (e.g. --bpe subword_nmt --bpe-codes
CODES --tokenizer moses), or --spm-model M (= --bpe sentencepiece); default: the teacher checkpoint's, else
none (then the text output and the scores stay on tokens, with a warning).
Output (written atomically): SPLIT.SRC (the source), SPLIT.TGT (the distilled targets, detokenized), both
line-aligned with the input; spm/ (the teacher's own tokens); bin/ (fairseq-binarized with the teacher's
dictionaries, ready for fairseq-train); meta.json (teacher, strategy, every setting, counts, BLEU/chrF vs
reference, timing); scores.tsv and the dataset card.
Backend: --backend fairseq (default, the reference) or ctranslate2 (the teacher converted once into
--ct2-cache, about twice as fast on a CPU; --compute-type float32/int8, float16/bfloat16 on a GPU).
Progress is saved in OUT.partial/ chunk by chunk: rerun the same command after a crash to finish.
Sharding: --num-shards N --shard-id K (or torchrun's RANK/WORLD_SIZE); the last shard to finish merges,
or run the same command with --merge. On a cluster, --launcher slurm --num-shards N submits the N shards as
one job array and waits until they are merged.

Recorded, documented behaviour for odd input: sources longer than the teacher's maximum positions are
decoded truncated (meta.json: truncated_source_lines); empty source lines are not decoded: they get an
empty target, are listed in meta.json (empty_source_lines) and left out of bin/ unless --keep-empty-lines.
Invalid UTF-8, line-count mismatches, missing or
unreadable checkpoints and dictionaries that do not match the teacher are errors (exit status 2).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nat_kd import cli, tokenization
from nat_kd.artifacts import PreparedCorpus
from nat_kd.errors import SettingsError
from nat_kd.launch.arguments import check_launcher_arguments

from .autobatch import CPU_MAX_TOKENS, GPU_MAX_TOKENS

if TYPE_CHECKING:
    from .config import DistillConfig

logger = logging.getLogger("nat_kd.generate_distilled")

# The generator's own modules are imported inside the functions below, after main has set up logging:
# importing them imports fairseq, which logs as it loads (nat_kd.cli.setup_logging).


def max_tokens_argument(value: str) -> int | str:
    """--max-tokens: a positive number of tokens, or auto."""
    if value == "auto":
        return value
    try:
        tokens = int(value)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of tokens (e.g. 12000), or auto to size "
                                         "batches to the GPU's free memory")
    return tokens


def add_teacher_arguments(teacher) -> None:
    """The teacher: checkpoints or a published folder, its dictionaries, its languages."""
    checkpoints = teacher.add_mutually_exclusive_group(required=True)
    checkpoints.add_argument("--teacher-path", metavar="CHECKPOINT[:CHECKPOINT...] | FOLDER",
                             help="teacher checkpoint; several, colon-separated, make an ensemble; or a published "
                                  "teacher's folder: CTranslate2 (model.bin) or Hugging Face (MarianMT, M2M100, "
                                  "NLLB), decoded by CTranslate2 with its own tokenizer")
    checkpoints.add_argument("--teacher", nargs="+", metavar="CHECKPOINT", help="deprecated: --teacher-path A:B")
    dictionaries = teacher.add_mutually_exclusive_group()
    dictionaries.add_argument("--teacher-data", metavar="DIR", help="folder with the teacher's dict.LANG.txt "
                              "(default: the data folder recorded in the checkpoint)")
    dictionaries.add_argument("--dict-dir", metavar="DIR", help="deprecated: --teacher-data")
    teacher.add_argument("--separately", action="store_true",
                         help="with several --teacher-path checkpoints: each decodes the corpus by itself, not as "
                              "an ensemble, into OUT.teachers/N (a set of its own, resumable), and OUT is one set of "
                              "several references a line (nat_kd.references; docs/students.md)")
    teacher.add_argument("--union", action="store_true",
                         help="with --separately: OUT holds the teachers' pairs one after the other instead, one "
                              "target a line")
    teacher.add_argument("--teacher-src-lang", metavar="CODE", help="a multilingual teacher's source language "
                         "(NLLB: eng_Latn; M2M100: en)")
    teacher.add_argument("--teacher-tgt-lang", metavar="CODE", help="its target language (deu_Latn; de)")


def add_corpus_arguments(corpus) -> None:
    """The corpus to distil, and the student's data for its tokens."""
    corpus.add_argument("--prepared", help="nat_kd.prepare output folder: sets --data DIR/bin, the tokenization "
                        "its manifest records (default DIR/spm.model), "
                        "--source/--reference DIR/raw/SPLIT.{SRC,TGT} unless given")
    corpus.add_argument("--data", help="fairseq-binarized folder with SPLIT.SRC-TGT.SRC.{bin,idx}")
    corpus.add_argument("--source", help="raw source text (one sentence a line)")
    corpus.add_argument("--reference", help="raw reference targets, line-aligned (needed by seq-inter, and "
                        "for the BLEU/chrF in meta.json; default: --data's target side of the split, decoded)")
    corpus.add_argument("--split", default="train", help="split name (default: train)")
    corpus.add_argument("--student-data", metavar="DIR", help="the student's nat_kd.prepare folder: bin/ holds the "
                        "distilled texts re-encoded with its tokenization and dictionaries (and its other splits), "
                        "whatever the teacher's tokens")


def add_decoding_arguments(dec) -> None:
    """The strategy and its settings (decoding/strategies.py)."""
    from .decoding import STRATEGIES, DecodingSettings

    d = DecodingSettings()
    dec.add_argument("--strategy", default=d.strategy, choices=list(STRATEGIES))
    dec.add_argument("--beam", type=int, default=d.beam, help="beam size (beam); K-best size (seq-inter)")
    dec.add_argument("--lenpen", type=float, default=d.lenpen, help="length penalty (beam, seq-inter)")
    dec.add_argument("--max-len-a", type=float, default=d.max_len_a)
    dec.add_argument("--max-len-b", type=int, default=d.max_len_b, help="max output length a*src_len+b")
    dec.add_argument("--temperature", type=float, default=d.temperature, help="sampling, topk, topp")
    dec.add_argument("--top-k", type=int, default=d.top_k, help="k for topk")
    dec.add_argument("--top-p", type=float, default=d.top_p, help="p for topp (nucleus)")
    dec.add_argument("--seed", type=int, default=d.seed, help="sampling seed (per sentence: seed + index)")
    dec.add_argument("--seq-inter-metric", default=d.seq_inter_metric, choices=["bleu", "chrf"])


def add_run_arguments(run) -> None:
    """The output, batching, shards, processes and device."""
    run.add_argument("--out", required=True, help="output folder")
    run.add_argument("--name", help="name recorded in meta.json (default: the output folder's name)")
    run.add_argument("--max-tokens", type=max_tokens_argument, default=None, metavar="N|auto",
                     help=f"tokens per batch, source or reference, whichever is longer (default: {CPU_MAX_TOKENS} on "
                          f"the CPU, fairseq-generate's own; {GPU_MAX_TOKENS} on a GPU, the fastest measured there; "
                          "a rerun into a folder of saved progress takes that run's); auto: on a GPU, the fairseq "
                          "backend's batches (tokens and sentences) sized to its free memory by a conservative "
                          "bound (nat_kd/distill/autobatch.py), recorded in meta.json's batching")
    run.add_argument("--max-sentences", type=int, default=None, help="sentences per batch")
    run.add_argument("--chunk-sentences", type=int, default=500, help="sentences per saved progress chunk")
    run.add_argument("--num-shards", type=int, default=None, help="default: $WORLD_SIZE (torchrun), else 1")
    run.add_argument("--shard-id", type=int, default=None, help="default: $RANK (torchrun), else 0")
    run.add_argument("--merge", action="store_true", help="only merge the shards (all must be complete)")
    run.add_argument("--workers", type=int, default=0,
                     help="decoding processes (default: one per core on a CPU, one on a GPU; on a GPU, N "
                          "processes share it, each with its own copy of the teacher)")
    run.add_argument("--threads", type=int, default=0,
                     help="torch threads per worker (default: cores/workers on a CPU, 1 on a GPU)")
    run.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default: cuda if available)")
    run.add_argument("--no-progress-bar", action="store_true")
    cli.add_verbose_argument(run)
    run.add_argument("--keep-empty-lines", action="store_true",
                     help="keep the pairs of empty source lines in bin/ (an empty source and target); by default "
                          "they are only in the text files, with an empty target, and listed in meta.json")


def add_backend_arguments(backend) -> None:
    """The backend, its precision and conversion cache, and the checks against a reference."""
    from .backends import backend_names

    backend.add_argument("--backend", choices=backend_names(),
                         help="fairseq (default for checkpoints, the reference: any architecture, ensembles) or "
                              "ctranslate2 (the teacher converted once; about twice as fast on a CPU; the only one "
                              "for a published teacher's folder); a backend of your own: docs/extending.md")
    backend.add_argument("--compute-type", default="float32",
                         help="ctranslate2: float32 (default), int8, int8_float32; on a GPU also float16, bfloat16")
    backend.add_argument("--fp16", action="store_true", help="fairseq on a GPU: the teacher in half precision")
    backend.add_argument("--check-against-fairseq", type=int, default=0, metavar="N",
                         help="ctranslate2: before writing the set, decode N sentences (spread over the corpus) "
                              "with the fairseq backend too; prints and records (meta.json) the share of identical "
                              "hypotheses and the BLEU difference")
    backend.add_argument("--check-against-transformers", type=int, default=0, metavar="N",
                         help="a Hugging Face teacher: the same check against transformers' own generate (same beam, "
                              "length penalty, maximum length)")
    backend.add_argument("--ct2-cache", metavar="DIR", help="ctranslate2: folder of converted teachers, keyed "
                         "by content hash (default: .ctranslate2-cache beside --out)")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; the options of the --bpe and --tokenizer named in ``argv`` (default: sys.argv) are added
    as fairseq adds them."""
    from .cluster import add_arguments as add_cluster_arguments

    p = argparse.ArgumentParser(prog="python -m nat_kd.generate_distilled", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_teacher_arguments(p.add_argument_group("teacher"))
    add_corpus_arguments(p.add_argument_group("corpus"))
    tokenization.add_arguments(p, sys.argv[1:] if argv is None else argv)
    add_decoding_arguments(p.add_argument_group("decoding"))
    add_run_arguments(p.add_argument_group("output and running"))
    add_backend_arguments(p.add_argument_group("backend (docs/generate_distilled.md: which to use)"))
    add_cluster_arguments(p)
    return p


def teacher_options(args) -> tuple[list[str], str | None]:
    """(checkpoints, dictionary folder) from --teacher-path/--teacher-data or their deprecated spellings."""
    from fairseq_plugins.teacher import split_paths

    for old, new in (("teacher", "--teacher-path A.pt[:B.pt...]"), ("dict_dir", "--teacher-data DIR")):
        if getattr(args, old) is not None:
            print(f"warning: --{old.replace('_', '-')} is deprecated; use {new}", file=sys.stderr)
    return split_paths(args.teacher_path or args.teacher), args.teacher_data or args.dict_dir


def config_from_args(args) -> DistillConfig:
    from .config import DistillConfig
    from .decoding import DecodingSettings

    data, source, reference, languages = args.data, args.source, args.reference, None
    text_settings = tokenization.settings_from_args(args)
    if args.prepared:
        prepared = PreparedCorpus(args.prepared)
        src, tgt = languages = prepared.language_pair()
        data = data or str(prepared.bin.root)
        if text_settings is None:
            text_settings = prepared.tokenization()
        source = source or str(prepared.raw(args.split, src))
        reference = reference or str(prepared.raw(args.split, tgt))
    teachers, dict_dir = teacher_options(args)
    settings = DecodingSettings(
        strategy=args.strategy, beam=args.beam, lenpen=args.lenpen, max_len_a=args.max_len_a,
        max_len_b=args.max_len_b, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, seq_inter_metric=args.seq_inter_metric)
    return DistillConfig(
        teachers=teachers, out_dir=args.out, tokenization=text_settings, split=args.split, source=source,
        data_dir=data, reference=reference, dict_dir=dict_dir, decoding=settings, name=args.name,
        max_tokens=args.max_tokens, max_sentences=args.max_sentences, chunk_sentences=args.chunk_sentences,
        num_shards=args.num_shards, shard_id=args.shard_id, merge_only=args.merge, workers=args.workers,
        threads=args.threads, device=args.device, progress_bar=not args.no_progress_bar, backend=args.backend,
        compute_type=args.compute_type, fp16=args.fp16, ct2_cache=args.ct2_cache,
        keep_empty_lines=args.keep_empty_lines, check_against_fairseq=args.check_against_fairseq,
        check_against_transformers=args.check_against_transformers, student_data=args.student_data,
        teacher_src_lang=args.teacher_src_lang, teacher_tgt_lang=args.teacher_tgt_lang, languages=languages)


def main(argv=None) -> int:
    cli.setup_logging(argv)
    args = build_parser(argv).parse_args(argv)

    def body() -> int:
        from .pipeline import distill

        check_launcher_arguments(args)
        if args.separately or args.union:
            return _each_teacher(args)
        if args.launcher != "local" or args.dry_run:
            from .cluster import launch

            result = launch(args, config_from_args(args))
            if result is None:  # --dry-run
                return 0
        else:
            result = distill(config_from_args(args))
        if result.complete:
            scores = result.meta.get("scores", {})
            strategy = result.meta["strategy"] or "none (the backend's own decoding)"
            print(f"{result.out_dir}: {result.meta['sentences']} sentences, strategy {strategy}"
                  + (f", BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} vs reference" if scores else ""))
            for reference, what in (("fairseq", "the fairseq backend"), ("transformers", "transformers' generate")):
                check = result.meta.get(f"check_against_{reference}")
                if check:
                    print(f"against {what} on {check['sentences']} sentences: {check['identical']} identical "
                          f"hypotheses ({100 * check['identical_share']:.2f}%)"
                          + (f", BLEU {check['bleu_difference']:+.2f}" if "bleu_difference" in check else ""))
        return 0

    return cli.run(body, resumable=True)


def _each_teacher(args) -> int:
    """--separately: each teacher's own set, then one set of several references a line (or their union)."""
    from dataclasses import replace

    from .references import build

    from .pipeline import distill

    cfg = config_from_args(args)
    if not args.separately:
        raise SettingsError("--union goes with --separately: the teachers' pairs one after the other")
    if len(cfg.teachers) < 2:
        raise SettingsError("--separately: give two teacher checkpoints or more, --teacher-path A.pt:B.pt")
    if args.launcher != "local" or args.dry_run or cfg.num_shards:
        raise SettingsError("--separately decodes here, a teacher after another: run each teacher's set with "
                            "--launcher or --num-shards by itself, then nat_kd.references --sets ...")
    out = Path(cfg.out_dir)
    parts = []
    for k, teacher in enumerate(cfg.teachers, start=1):
        part = out.with_name(f"{out.name}.teachers") / str(k)
        logger.info("teacher %d of %d: %s -> %s", k, len(cfg.teachers), teacher, part)
        result = distill(replace(cfg, teachers=[teacher], out_dir=str(part), name=f"{cfg.name or out.name}.{k}"))
        if not result.complete:
            return 0  # a shard's run; the others finish it
        parts.append(part)
    meta = build(parts, out, union=args.union, name=cfg.name, reference=cfg.reference)
    record = meta["union" if args.union else "references"]
    print(f"{out}: {len(parts)} teachers' sets as " + ("their union" if args.union else "references of each line")
          + f"; their mean BLEU against each other {record['mean_pairwise_bleu']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
