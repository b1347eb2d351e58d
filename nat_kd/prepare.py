"""Prepare a parallel corpus for fairseq: raw text -> subword tokens -> fairseq binaries.

    python -m nat_kd.prepare --src en --tgt de            # Multi30k; or --tgt mix: en -> {de, fr, cs}, untagged
    python -m nat_kd.prepare --src en --tgt ro --trainpref corpus/train --validpref corpus/dev \
        --testpref corpus/test [--spm-model M | --bpe-codes CODES [--tokenizer moses] | --pretokenized] \
        [--separate-dictionaries] --out-dir data/my-corpus

Multi30k is read from --data-dir, $NAT_KD_DATA or ../shared/data/multi30k; where none is given or there, the files
the pair needs are downloaded once from its public repository into data/multi30k/, each checked against its sha256.

Any parallel corpus is given as fairseq-preprocess takes it: file prefixes, PREFIX.SRC and PREFIX.TGT (or
.gz), any language codes. Its tokens: a joint sentencepiece model trained here (the default), an existing
sentencepiece model, subword-nmt BPE codes (fairseq's encoders, optionally over Moses tokens), or text that
is already tokenized (then it is only binarized).

Output (default ``data/multi30k.SRC-TGT.spmV``), with fairseq's split names train/valid/test:
    raw/SPLIT.{SRC,TGT}   the text actually used (detokenized unless --pretokenized), e.g. the references for BLEU
    spm.model, spm.vocab  the sentencepiece model (trained here, or a copy of --spm-model)
    bpe.codes             (--bpe-codes) a copy of the codes
    spm/SPLIT.{SRC,TGT}   the model's tokens (sentencepiece pieces or BPE units)
    bin/                  fairseq-preprocess output, one joined dictionary unless --separate-dictionaries
    SPLIT.lang            (mix only) the true language of each target line
    manifest.json         settings, input hashes, counts, the tokenization: re-running with the same inputs is a
                          no-op, and nat_kd.generate_distilled --prepared reads how to detokenize; no path
                          outside the folder, so that the same corpus read from anywhere has the same bytes
                          (a study takes its digest as the corpus's)
    source.json           where the corpus was read from: the Multi30k folder, or the own corpus's prefixes and
                          its model or codes
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from . import atomic, cli, multi30k
from .artifacts import PreparedCorpus
from .corpus import LANGUAGES, PROJECT_ROOT, CorpusError, iter_parallel, read_parallel, split_file
from .errors import SettingsError
from .hashing import sha256_file, sha256_json
from .machine import available_cores
from .tokenization import Tokenization, TokenizationSettings

# Bump when the preparation itself changes, so that old outputs are rebuilt.
PREPARE_VERSION = 1
MIX = "mix"
FAIRSEQ_SPLITS = {"train": "train", "val": "valid", "test_2016_flickr": "test"}
logger = logging.getLogger("nat_kd.prepare")
# sentencepiece's pieces depend on how many threads train it (its EM sums each thread's share apart): a fixed
# count keeps the vocabulary the corpus's and the settings' alone, the same on every machine and --workers
SENTENCEPIECE_THREADS = 2


@dataclass(frozen=True)
class PrepareConfig:
    src: str
    tgt: str  # a language, or "mix" for every other language as an untagged target
    vocab_size: int = 8000
    spm_model_type: str = "unigram"
    train_limit: int | None = None  # keep only the first N training pairs (tests, quick runs)
    # Any corpus (default: Multi30k): fairseq-preprocess's prefixes, PREFIX.SRC and PREFIX.TGT (or .gz)
    trainpref: str | None = None
    validpref: str | None = None
    testpref: str | None = None
    # Its tokens (default: a joint sentencepiece model trained here): one of
    spm_model: str | None = None  # an existing sentencepiece model
    bpe_codes: str | None = None  # subword-nmt BPE codes, over the words of ``tokenizer`` (or of the raw text)
    tokenizer: str | None = None  # a fairseq --tokenizer under the BPE codes, e.g. moses
    pretokenized: bool = False  # the text is already in the model's tokens: only binarize
    joined_dictionary: bool = True

    def __post_init__(self):
        if self.trainpref:
            if not (self.src and self.tgt) or self.src == self.tgt or MIX in (self.src, self.tgt):
                raise CorpusError(f"--src {self.src} --tgt {self.tgt}: give two different language codes, the "
                                  "suffixes of the files PREFIX.SRC and PREFIX.TGT")
            given = [name for name in ("spm_model", "bpe_codes", "pretokenized") if getattr(self, name)]
            if len(given) > 1:
                raise SettingsError(f"choose one of --spm-model, --bpe-codes, --pretokenized (got {', '.join(given)})")
            if self.tokenizer and not self.bpe_codes:
                raise SettingsError("--tokenizer is the word tokenizer under --bpe-codes; pass --bpe-codes too")
            return
        if any(getattr(self, f.name) != f.default for f in fields(self) if f.name in OWN_CORPUS_FIELDS):
            raise SettingsError("--validpref, --testpref, --spm-model, --bpe-codes, --tokenizer, --pretokenized and "
                                "--separate-dictionaries describe your own corpus: pass --trainpref too")
        if self.src not in LANGUAGES or (self.tgt not in LANGUAGES and self.tgt != MIX) or self.src == self.tgt:
            raise CorpusError(
                f"unknown language pair {self.src}-{self.tgt}: choose two different languages from "
                f"{', '.join(LANGUAGES)}, or '{MIX}' as the target for the mixed multi-target corpus"
            )

    @property
    def target_languages(self) -> tuple[str, ...]:
        return tuple(lang for lang in LANGUAGES if lang != self.src) if self.tgt == MIX else (self.tgt,)

    def default_out_dir(self) -> Path:
        if self.trainpref:
            raise SettingsError("pass --out-dir for your own corpus")
        limit = f".first{self.train_limit}" if self.train_limit else ""
        return PROJECT_ROOT / "data" / f"multi30k.{self.src}-{self.tgt}.spm{self.vocab_size}{limit}"

    def prefixes(self) -> dict[str, str]:
        """fairseq's split name -> the prefix of its files (own corpora)."""
        return {name: prefix for name, prefix in (("train", self.trainpref), ("valid", self.validpref),
                                                  ("test", self.testpref)) if prefix}

    def settings(self) -> dict:
        """What the output depends on. The own-corpus fields count only when set, so that Multi30k folders
        prepared before they existed stay up to date."""
        return {key: value for key, value in asdict(self).items()
                if key not in OWN_CORPUS_FIELDS or value != PrepareConfig.__dataclass_fields__[key].default}


PATH_FIELDS = ("trainpref", "validpref", "testpref", "spm_model", "bpe_codes")  # hashed by content, not by name
OWN_CORPUS_FIELDS = ("trainpref", "validpref", "testpref", "spm_model", "bpe_codes", "tokenizer", "pretokenized",
                     "joined_dictionary")


def load_split(raw_dir: Path, split: str, cfg: PrepareConfig,
               limit: int | None = None) -> list[tuple[str, str, str]]:
    """(source, target, target language) triples of a Multi30k split; for mix, one per target language,
    interleaved."""
    per_lang = []
    for lang in cfg.target_languages:
        src, tgt = read_parallel(split_file(raw_dir, split, cfg.src), split_file(raw_dir, split, lang))
        per_lang.append((src[:limit], tgt[:limit], lang))
    return [(src[i], tgt[i], lang) for i in range(len(per_lang[0][0])) for src, tgt, lang in per_lang]


def own_split(files: dict[str, Path], cfg: PrepareConfig,
              limit: int | None = None) -> Iterator[tuple[str, str, None]]:
    """(source, target, None) triples of an own corpus's split, one at a time as read, the first ``limit``; the
    files are read to the end all the same, to check that they are line-aligned."""
    for number, (src, tgt) in enumerate(iter_parallel(files[cfg.src], files[cfg.tgt])):
        if limit is None or number < limit:
            yield src, tgt, None


def _prefixed(prefix: str, lang: str, option: str) -> Path:
    """PREFIX.LANG(.gz), as fairseq-preprocess names a split's files."""
    return split_file(Path(prefix).parent, Path(prefix).name, lang, option)


def input_files(raw_dir: Path | None, cfg: PrepareConfig) -> dict[str, dict[str, Path]]:
    """fairseq's split name -> language -> the file it is read from."""
    if cfg.trainpref:
        return {name: {lang: _prefixed(prefix, lang, f"--{name}pref") for lang in (cfg.src, cfg.tgt)}
                for name, prefix in cfg.prefixes().items()}
    return {name: {lang: split_file(raw_dir, split, lang) for lang in (cfg.src, *cfg.target_languages)}
            for split, name in FAIRSEQ_SPLITS.items()}


def fingerprint(raw_dir: Path | None, cfg: PrepareConfig) -> tuple[str, dict]:
    """A hash of everything the output depends on: settings, code version and every input file's bytes. Where
    the files are is not part of it: a moved corpus is the same corpus."""
    inputs = {}
    for name, files in input_files(raw_dir, cfg).items():
        for lang, path in files.items():
            inputs[f"{name}.{lang}" if cfg.trainpref else path.name] = sha256_file(path)
    for option in ("spm_model", "bpe_codes"):
        model = getattr(cfg, option)
        if model:
            if not Path(model).is_file():
                raise CorpusError(f"{model} does not exist; check --{option.replace('_', '-')}")
            inputs[option] = sha256_file(model)
    return sha256_json({"config": placeless_settings(cfg), "version": PREPARE_VERSION, "inputs": inputs}), inputs


def placeless_settings(cfg: PrepareConfig) -> dict:
    """The settings with each file given (an own corpus's prefixes, its model or codes) as true: files count
    by their content (the fingerprint's inputs), not by where they are (source.json)."""
    return {key: (bool(value) if key in PATH_FIELDS else value) for key, value in cfg.settings().items()}


def is_up_to_date(out_dir: Path, key: str, cfg: PrepareConfig) -> bool:
    prepared = PreparedCorpus(out_dir)
    try:
        manifest = prepared.manifest()
    except CorpusError:  # a damaged manifest: rebuild
        return False
    # a manifest naming the folder it was read from (before source.json) is rebuilt, to the same content
    return (manifest is not None and manifest.get("fingerprint") == key and "raw_dir" not in manifest
            and prepared.bin.dictionary(cfg.src).exists())


def check_out_dir(out_dir: Path, raw_dir: Path | None, cfg: PrepareConfig) -> None:
    """Refuse, before any work, an ``out_dir`` (resolved) that replacing it whole would lose something in: one
    that is or holds an input file, or holds anything but an earlier prepared corpus."""
    inputs = [path for files in input_files(raw_dir, cfg).values() for path in files.values()]
    inputs += [Path(getattr(cfg, option)) for option in ("spm_model", "bpe_codes") if getattr(cfg, option)]
    for path in inputs:
        if out_dir == path.resolve() or out_dir in path.resolve().parents:
            raise SettingsError(f"--out-dir {out_dir} is or holds the input {path}, and preparing replaces that "
                                "folder whole: choose another --out-dir")
    atomic.check_replaceable(out_dir, PreparedCorpus(out_dir).manifest_file.name, "a prepared corpus", "--out-dir")


def write_split(prepared: PreparedCorpus, name: str, cfg: PrepareConfig, triples, encode: dict) -> int:
    """One split's raw/ and spm/ files (and for mix its SPLIT.lang) written line by line from its (source,
    target, target language) ``triples``, each side's pieces by ``encode[lang](line)``; returns how many."""
    sides = (cfg.src, cfg.tgt)
    with ExitStack() as stack:
        def create(path: Path):
            path.parent.mkdir(parents=True, exist_ok=True)
            return stack.enter_context(open(path, "w", encoding="utf-8"))

        raw = {lang: create(prepared.raw(name, lang)) for lang in sides}
        pieces = {lang: create(prepared.pieces(name, lang)) for lang in sides}
        languages = create(prepared.languages_file(name)) if cfg.tgt == MIX else None
        count = 0
        for count, (source, target, language) in enumerate(triples, 1):
            for lang, line in zip(sides, (source, target)):
                raw[lang].write(line + "\n")
                pieces[lang].write(encode[lang](line) + "\n")
            if languages:
                languages.write(language + "\n")
    return count


def train_sentencepiece(lines: list[str], model: Path, cfg: PrepareConfig):
    """Train into ``model`` (NAME.model, beside it NAME.vocab)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(model.with_suffix("")), vocab_size=cfg.vocab_size,
        model_type=cfg.spm_model_type, character_coverage=1.0, num_threads=SENTENCEPIECE_THREADS,
        # a soft limit: tiny slices (tests) cannot fill a large vocabulary, and that is not an error
        hard_vocab_limit=False,
        # fairseq's dictionary adds its own <s>, <pad>, </s>; sentencepiece keeps only <unk>
        bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=str(model))


def binarize(prepared: PreparedCorpus, cfg: PrepareConfig, splits, workers: int) -> None:
    """fairseq's own preprocessing, with one dictionary joined over source and target unless asked otherwise."""
    from fairseq import options
    from fairseq_cli import preprocess

    args = [arg for name in splits for arg in (f"--{name}pref", str(prepared.pieces_prefix(name)))]
    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", cfg.src, "--target-lang", cfg.tgt, *args, "--destdir", str(prepared.bin.root),
        "--workers", str(workers), *(["--joined-dictionary"] if cfg.joined_dictionary else []),
    ])
    preprocess.main(args)


def own_tokenization(prepared: PreparedCorpus, cfg: PrepareConfig) -> TokenizationSettings:
    """The settings of an own corpus's tokens, with its model or codes copied into the prepared folder."""
    if cfg.spm_model:
        shutil.copyfile(cfg.spm_model, prepared.spm_model)
        vocab = Path(cfg.spm_model).with_suffix(".vocab")
        if vocab.is_file():
            shutil.copyfile(vocab, prepared.spm_model.with_suffix(".vocab"))
        return TokenizationSettings.sentencepiece(prepared.spm_model)
    if cfg.bpe_codes:
        shutil.copyfile(cfg.bpe_codes, prepared.bpe_codes)
        return TokenizationSettings(bpe={"_name": "subword_nmt", "bpe_codes": str(prepared.bpe_codes)},
                                    tokenizer={"_name": cfg.tokenizer} if cfg.tokenizer else None)
    return TokenizationSettings()  # pretokenized


def prepare(cfg: PrepareConfig, raw_dir=None, out_dir=None, workers: int | None = None, force: bool = False) -> Path:
    """Build (or reuse) the prepared corpus for ``cfg``; returns its directory. ``workers``: fairseq-preprocess's
    processes (default: one per available core); the output is the same whatever their number."""
    raw_dir = None if cfg.trainpref else multi30k.raw_dir(raw_dir, (cfg.src, *cfg.target_languages))
    out_dir = (Path(out_dir) if out_dir else cfg.default_out_dir()).resolve()
    check_out_dir(out_dir, raw_dir, cfg)
    key, inputs = fingerprint(raw_dir, cfg)
    if not force and is_up_to_date(out_dir, key, cfg):
        logger.info("%s is up to date (same inputs and settings): nothing to do", out_dir)
        return out_dir

    logger.info("preparing %s-%s from %s into %s", cfg.src, cfg.tgt, raw_dir or cfg.trainpref, out_dir)
    with atomic.building_directory(out_dir) as work:
        prepared = PreparedCorpus(work)
        # an own corpus is read as it is written, line by line: memory stays flat whatever its size
        if cfg.trainpref:
            splits = {name: own_split(files, cfg, cfg.train_limit if name == "train" else None)
                      for name, files in input_files(None, cfg).items()}
        else:
            splits = {name: load_split(raw_dir, split, cfg, cfg.train_limit if split == "train" else None)
                      for split, name in FAIRSEQ_SPLITS.items()}
        manifest = {}
        if cfg.trainpref and (cfg.spm_model or cfg.bpe_codes or cfg.pretokenized):
            settings = own_tokenization(prepared, cfg)
            codecs = {lang: Tokenization(settings, lang) for lang in (cfg.src, cfg.tgt)}
            encode = {lang: codec.encode for lang, codec in codecs.items()}
            manifest["tokenization"] = prepared.relative_tokenization(settings)
        else:
            train = splits["train"] = list(splits["train"])  # the trainer takes the training text whole
            sp = train_sentencepiece([src for src, _, _ in train] + [tgt for _, tgt, _ in train], prepared.spm_model,
                                     cfg)
            encode = dict.fromkeys((cfg.src, cfg.tgt), lambda line: " ".join(sp.encode(line, out_type=str)))
            manifest["sentencepiece_pieces"] = sp.get_piece_size()
        counts = {name: write_split(prepared, name, cfg, triples, encode) for name, triples in splits.items()}
        binarize(prepared, cfg, list(splits), workers or available_cores())
        dictionary_size = sum(1 for _ in open(prepared.bin.dictionary(cfg.src), encoding="utf-8"))
        given = {key: value for key, value in cfg.settings().items() if key in PATH_FIELDS and value}
        atomic.write_json(prepared.source_file, {"raw_dir": str(raw_dir or Path(cfg.trainpref).parent), **given})
        atomic.write_json(prepared.manifest_file, {
            "fingerprint": key, "config": placeless_settings(cfg), "prepare_version": PREPARE_VERSION,
            "inputs_sha256": inputs, "sentences": counts,
            **manifest, "fairseq_dictionary_entries": dictionary_size,
            **({"split_names": FAIRSEQ_SPLITS} if not cfg.trainpref else {}),
        })
    return out_dir


def main(argv=None) -> int:
    cli.setup_logging(argv)
    parser = argparse.ArgumentParser(prog="python -m nat_kd.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default="en", help=f"source language (Multi30k: {', '.join(LANGUAGES)}; any code "
                                                    "with --trainpref)")
    parser.add_argument("--tgt", default="de", help=f"target language, or '{MIX}' for all other Multi30k languages")
    parser.add_argument("--vocab-size", type=int, default=8000, help="joint sentencepiece vocabulary size")
    parser.add_argument("--spm-model-type", default="unigram", choices=["unigram", "bpe"])
    parser.add_argument("--train-limit", type=int, default=None, help="use only the first N training pairs")
    parser.add_argument("--data-dir", default=None, help="Multi30k's raw folder (default: $NAT_KD_DATA, else "
                        "../shared/data/multi30k, else data/multi30k/, where the files the pair needs are downloaded "
                        f"when missing from https://github.com/multi30k/dataset, or ${multi30k.URL_ENV}, a mirror; "
                        "sha256 checked)")
    own = parser.add_argument_group("your own corpus (instead of Multi30k)")
    own.add_argument("--trainpref", help="training files PREFIX.SRC and PREFIX.TGT (or .gz)")
    own.add_argument("--validpref", help="validation files prefix")
    own.add_argument("--testpref", help="test files prefix")
    tokens = own.add_mutually_exclusive_group()
    tokens.add_argument("--spm-model", help="an existing sentencepiece model (default: train a joint one)")
    tokens.add_argument("--bpe-codes", help="subword-nmt BPE codes (fairseq's --bpe subword_nmt)")
    tokens.add_argument("--pretokenized", action="store_true", help="the text is already in the model's tokens: "
                        "only binarize it")
    own.add_argument("--tokenizer", help="fairseq --tokenizer under --bpe-codes (e.g. moses) for raw text")
    own.add_argument("--separate-dictionaries", action="store_true",
                     help="one dictionary per language (default: one joined dictionary)")
    parser.add_argument("--out-dir", default=None, help="output folder, replaced whole: a new or empty one, or an "
                        "earlier output of this command (default: data/multi30k.SRC-TGT.spmV)")
    parser.add_argument("--workers", type=int, default=None,
                        help="fairseq-preprocess's processes (default: one per core); the output is the same "
                             "whatever their number")
    parser.add_argument("--force", action="store_true", help="rebuild even when inputs are unchanged")
    cli.add_verbose_argument(parser)
    args = parser.parse_args(argv)

    def body() -> int:
        cfg = PrepareConfig(args.src, args.tgt, args.vocab_size, args.spm_model_type, args.train_limit,
                            trainpref=args.trainpref, validpref=args.validpref, testpref=args.testpref,
                            spm_model=args.spm_model, bpe_codes=args.bpe_codes, tokenizer=args.tokenizer,
                            pretokenized=args.pretokenized, joined_dictionary=not args.separate_dictionaries)
        print(prepare(cfg, args.data_dir, args.out_dir, args.workers, args.force))
        return 0

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
