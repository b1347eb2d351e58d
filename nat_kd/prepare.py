"""Prepare a Multi30k language pair for fairseq: raw text -> joint sentencepiece -> fairseq binaries.

    python -m nat_kd.prepare --src en --tgt de            # or --tgt mix: en -> {de, fr, cs}, untagged

Output (default ``data/multi30k.SRC-TGT.spmV``), with fairseq's split names train/valid/test:
    raw/SPLIT.{SRC,TGT}   the raw (detokenized) text actually used, e.g. the references for BLEU
    spm.model, spm.vocab  the joint sentencepiece model trained on train source + target
    spm/SPLIT.{SRC,TGT}   sentencepiece pieces
    bin/                  fairseq-preprocess output with one joined dictionary
    SPLIT.lang            (mix only) the true language of each target line
    manifest.json         settings, input hashes, counts: re-running with the same inputs is a no-op
"""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from . import atomic, cli
from .artifacts import PreparedCorpus
from .corpus import LANGUAGES, PROJECT_ROOT, CorpusError, data_dir, read_parallel, split_file
from .hashing import sha256_file, sha256_json

# Bump when the preparation itself changes, so that old outputs are rebuilt.
PREPARE_VERSION = 1
MIX = "mix"
FAIRSEQ_SPLITS = {"train": "train", "val": "valid", "test_2016_flickr": "test"}
logger = logging.getLogger("nat_kd.prepare")


@dataclass(frozen=True)
class PrepareConfig:
    src: str
    tgt: str  # a language, or "mix" for every other language as an untagged target
    vocab_size: int = 8000
    spm_model_type: str = "unigram"
    train_limit: int | None = None  # keep only the first N training pairs (tests, quick runs)

    def __post_init__(self):
        if self.src not in LANGUAGES or (self.tgt not in LANGUAGES and self.tgt != MIX) or self.src == self.tgt:
            raise CorpusError(
                f"unknown language pair {self.src}-{self.tgt}: choose two different languages from "
                f"{', '.join(LANGUAGES)}, or '{MIX}' as the target for the mixed multi-target corpus"
            )

    @property
    def target_languages(self) -> tuple[str, ...]:
        return tuple(lang for lang in LANGUAGES if lang != self.src) if self.tgt == MIX else (self.tgt,)

    def default_out_dir(self) -> Path:
        limit = f".first{self.train_limit}" if self.train_limit else ""
        return PROJECT_ROOT / "data" / f"multi30k.{self.src}-{self.tgt}.spm{self.vocab_size}{limit}"


def load_split(raw_dir: Path, split: str, cfg: PrepareConfig, limit: int | None = None):
    """(source, target, target-language) lines of a split; for mix, one pair per target language, interleaved."""
    per_lang = []
    for lang in cfg.target_languages:
        src, tgt = read_parallel(split_file(raw_dir, split, cfg.src), split_file(raw_dir, split, lang))
        per_lang.append((src[:limit], tgt[:limit], lang))
    sources, targets, langs = [], [], []
    for i in range(len(per_lang[0][0])):
        for src, tgt, lang in per_lang:
            sources.append(src[i])
            targets.append(tgt[i])
            langs.append(lang)
    return sources, targets, langs


def fingerprint(raw_dir: Path, cfg: PrepareConfig) -> tuple[str, dict]:
    """A hash of everything the output depends on: settings, code version and every input file's bytes."""
    inputs = {}
    for split in FAIRSEQ_SPLITS:
        for lang in (cfg.src, *cfg.target_languages):
            path = split_file(raw_dir, split, lang)
            inputs[path.name] = sha256_file(path)
    return sha256_json({"config": asdict(cfg), "version": PREPARE_VERSION, "inputs": inputs}), inputs


def is_up_to_date(out_dir: Path, key: str, cfg: PrepareConfig) -> bool:
    prepared = PreparedCorpus(out_dir)
    try:
        manifest = prepared.manifest()
    except CorpusError:  # a damaged manifest: rebuild
        return False
    return (manifest is not None and manifest.get("fingerprint") == key
            and prepared.bin.dictionary(cfg.src).exists())


def _write_lines(path: Path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def train_sentencepiece(lines: list[str], model: Path, cfg: PrepareConfig, threads: int):
    """Train into ``model`` (NAME.model, beside it NAME.vocab)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(model.with_suffix("")), vocab_size=cfg.vocab_size,
        model_type=cfg.spm_model_type, character_coverage=1.0, num_threads=threads,
        # a soft limit: tiny slices (tests) cannot fill a large vocabulary, and that is not an error
        hard_vocab_limit=False,
        # fairseq's dictionary adds its own <s>, <pad>, </s>; sentencepiece keeps only <unk>
        bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=str(model))


def binarize(prepared: PreparedCorpus, cfg: PrepareConfig, workers: int) -> None:
    """fairseq's own preprocessing, with one dictionary joined over source and target."""
    from fairseq import options
    from fairseq_cli import preprocess

    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", cfg.src, "--target-lang", cfg.tgt,
        "--trainpref", str(prepared.pieces_prefix("train")), "--validpref", str(prepared.pieces_prefix("valid")),
        "--testpref", str(prepared.pieces_prefix("test")), "--destdir", str(prepared.bin.root),
        "--joined-dictionary", "--workers", str(workers),
    ])
    preprocess.main(args)


def prepare(cfg: PrepareConfig, raw_dir=None, out_dir=None, workers: int = 2, force: bool = False) -> Path:
    """Build (or reuse) the prepared corpus for ``cfg``; returns its directory."""
    raw_dir = data_dir(raw_dir)
    out_dir = Path(out_dir) if out_dir else cfg.default_out_dir()
    key, inputs = fingerprint(raw_dir, cfg)
    if not force and is_up_to_date(out_dir, key, cfg):
        logger.info("%s is up to date (same inputs and settings): nothing to do", out_dir)
        return out_dir

    logger.info("preparing %s-%s from %s into %s", cfg.src, cfg.tgt, raw_dir, out_dir)
    with atomic.building_directory(out_dir) as work:
        prepared = PreparedCorpus(work)
        counts, splits = {}, {}
        for split, name in FAIRSEQ_SPLITS.items():
            limit = cfg.train_limit if split == "train" else None
            splits[name] = load_split(raw_dir, split, cfg, limit)
            counts[name] = len(splits[name][0])
        sp = train_sentencepiece(splits["train"][0] + splits["train"][1], prepared.spm_model, cfg, workers)
        for name, (sources, targets, langs) in splits.items():
            for lang, lines in ((cfg.src, sources), (cfg.tgt, targets)):
                _write_lines(prepared.raw(name, lang), lines)
                _write_lines(prepared.pieces(name, lang), (" ".join(p) for p in sp.encode(lines, out_type=str)))
            if cfg.tgt == MIX:
                _write_lines(prepared.languages_file(name), langs)
        binarize(prepared, cfg, workers)
        dictionary_size = sum(1 for _ in open(prepared.bin.dictionary(cfg.src), encoding="utf-8"))
        atomic.write_json(prepared.manifest_file, {
            "fingerprint": key, "config": asdict(cfg), "prepare_version": PREPARE_VERSION,
            "raw_dir": str(raw_dir), "inputs_sha256": inputs, "sentences": counts,
            "sentencepiece_pieces": sp.get_piece_size(), "fairseq_dictionary_entries": dictionary_size,
            "split_names": FAIRSEQ_SPLITS,
        })
    return out_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nat_kd.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default="en", help=f"source language ({', '.join(LANGUAGES)})")
    parser.add_argument("--tgt", default="de", help=f"target language, or '{MIX}' for all other languages")
    parser.add_argument("--vocab-size", type=int, default=8000, help="joint sentencepiece vocabulary size")
    parser.add_argument("--spm-model-type", default="unigram", choices=["unigram", "bpe"])
    parser.add_argument("--train-limit", type=int, default=None, help="use only the first N training pairs")
    parser.add_argument("--data-dir", default=None, help="raw corpus folder (default: $NAT_KD_DATA or ../shared/data/multi30k)")
    parser.add_argument("--out-dir", default=None, help="output folder (default: data/multi30k.SRC-TGT.spmV)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--force", action="store_true", help="rebuild even when inputs are unchanged")
    args = parser.parse_args(argv)
    cli.setup_logging()

    def body() -> int:
        cfg = PrepareConfig(args.src, args.tgt, args.vocab_size, args.spm_model_type, args.train_limit)
        print(prepare(cfg, args.data_dir, args.out_dir, args.workers, args.force))
        return 0

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
