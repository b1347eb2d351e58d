"""Between plain text and a model's tokens, with fairseq's own encoders (``fairseq.data.encoders``).

Used by nat_kd.prepare (raw text to tokens) and by the generator (raw sources to the teacher's tokens, its
outputs and the binarized references back to text). Not the word splitting of the metrics
(nat_kd/analysis/tokenizers/).

The settings are fairseq's: ``--bpe`` (sentencepiece, subword_nmt, gpt2, ... with that BPE's own options,
e.g. ``--bpe-codes``), ``--tokenizer`` (moses, space, ...) and ``--post-process`` (fairseq-generate's
``--remove-bpe``: undoes a BPE without its model). They come from the command line or, when it gives none,
from the teacher's checkpoint (its ``bpe`` and ``tokenizer`` sections), as fairseq-generate reads them.

    encode: text -> tokenizer.encode -> bpe.encode -> the teacher's tokens (raw sources, raw references' lengths)
    decode: tokens -> post_process -> bpe.decode -> tokenizer.decode -> text (text output, scores, seq-inter)

decode is fairseq-generate's ``decode_fn`` after ``post_process_prediction``: the text output equals its
``D-`` lines. With no setting at all, text stays in tokens; the generator says so, and the scores are then
on tokens.
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file

logger = logging.getLogger("nat_kd.generate_distilled")

# options of fairseq's encoders that name a file: a missing one is an error here, and its bytes are
# fingerprinted (a URL, which fairseq downloads itself, is left to fairseq)
_FILE_OPTIONS = ("sentencepiece_model", "bpe_codes", "gpt2_encoder_json", "gpt2_vocab_bpe", "bpe_merges",
                 "bpe_vocab", "sentencepiece_model_path")
# encoder options that fairseq fills from the task's language pair (moses: tokenize in the source language,
# detokenize in the target language); here both are the language of the text at hand, so that a source side
# is detokenized by the source language's rules too
_LANGUAGE_OPTIONS = ("source_lang", "target_lang")


@dataclass(frozen=True)
class TokenizationSettings:
    """fairseq's bpe and tokenizer sections as plain dicts (``{"_name": "subword_nmt", "bpe_codes": FILE}``;
    None: not used) and its post-process symbol."""

    bpe: dict | None = None
    tokenizer: dict | None = None
    post_process: str | None = None

    @classmethod
    def sentencepiece(cls, model: str | Path) -> TokenizationSettings:
        return cls(bpe={"_name": "sentencepiece", "sentencepiece_model": str(model)})

    @classmethod
    def from_checkpoint(cls, cfg) -> TokenizationSettings | None:
        """The ``bpe`` and ``tokenizer`` sections of a fairseq checkpoint's configuration; None if it has none."""
        from omegaconf import OmegaConf

        sections = {}
        for name in ("bpe", "tokenizer"):
            section = cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)
            if section is not None and section.get("_name"):
                sections[name] = OmegaConf.to_container(section, resolve=False)
        return cls(**sections) if sections else None

    @property
    def is_plain_sentencepiece(self) -> bool:
        """Only a sentencepiece model: what nat_kd.prepare's corpora use (``--spm-model``)."""
        return (self.tokenizer is None and self.post_process is None and self.bpe is not None
                and self.bpe.get("_name") == "sentencepiece" and set(self.bpe) == {"_name", "sentencepiece_model"})

    @property
    def detokenizes(self) -> bool:
        return bool(self.bpe or self.tokenizer or self.post_process)

    def files(self) -> dict[str, str]:
        """The files the settings name, by option."""
        return {key: str(value) for section in (self.bpe, self.tokenizer) if section
                for key, value in section.items() if key in _FILE_OPTIONS and value and "://" not in str(value)}

    def fingerprint(self) -> dict:
        """What a distilled set's text depends on: the settings and the bytes of the files they name.
        Plain sentencepiece keeps the key it always had (``spm_model``), so earlier runs stay valid."""
        files = self.files()
        for key, path in files.items():
            if not Path(path).is_file():
                raise SettingsError(f"{path} does not exist: check --{key.replace('_', '-')}")
        if self.is_plain_sentencepiece:
            return {"spm_model": sha256_file(files["sentencepiece_model"])}
        return {"tokenization": {**self.describe(), "files_sha256": {k: sha256_file(p) for k, p in files.items()}}}

    def fairseq_flags(self, source_lang: str, target_lang: str) -> list[str]:
        """The same settings as fairseq-generate options (its D- lines are then this module's decode)."""
        if self.is_plain_sentencepiece:  # the spelling fairseq's docs and this project's commands use
            return ["--remove-bpe", "sentencepiece"]
        flags = ["--post-process", self.post_process] if self.post_process else []
        for name, section in (("bpe", self.bpe), ("tokenizer", self.tokenizer)):
            for key, value in (section or {}).items():
                option = f"--{name}" if key == "_name" else f"--{key.replace('_', '-')}"
                if key in _LANGUAGE_OPTIONS or value is None or value is False:
                    continue  # the task's languages, below
                flags += [option] if value is True else [option, str(value)]
        if self.tokenizer:  # fairseq fills the tokenizer's languages (moses) from these, and fails without them
            flags += ["--source-lang", source_lang, "--target-lang", target_lang]
        return flags

    def describe(self) -> dict:
        return {"bpe": self.bpe, "tokenizer": self.tokenizer, "post_process": self.post_process,
                "detokenized": self.detokenizes}


NO_TOKENIZATION = TokenizationSettings()


def resolve(settings: TokenizationSettings | None, checkpoint_cfg) -> TokenizationSettings:
    """The settings given, else the checkpoint's, else none (with a warning: text and scores stay on tokens)."""
    if settings is None:
        settings = TokenizationSettings.from_checkpoint(checkpoint_cfg) if checkpoint_cfg is not None else None
        if settings is not None:
            logger.info("detokenizing with the teacher checkpoint's settings: bpe %s, tokenizer %s",
                        (settings.bpe or {}).get("_name"), (settings.tokenizer or {}).get("_name"))
    if settings is None or not settings.detokenizes:
        logger.warning("no detokenization (none of --bpe, --tokenizer, --post-process, --spm-model given or recorded "
                       "in the teacher's checkpoint, or --bpe none): the text output stays in the teacher's tokens "
                       "and BLEU/chrF are computed on tokens, not comparable with detokenized scores")
        return NO_TOKENIZATION
    return settings


class Tokenization:
    """The encoders of ``settings`` for text in ``lang``, built by fairseq's registries."""

    def __init__(self, settings: TokenizationSettings, lang: str):
        from fairseq.data import encoders

        self.settings, self.lang = settings, lang
        for path in settings.files().values():
            if not Path(path).is_file():
                raise SettingsError(f"{path} does not exist; check the --bpe options (or --spm-model)")
        self.bpe = self._build(encoders.build_bpe, encoders.BPE_REGISTRY, settings.bpe, "--bpe", lang)
        self.tokenizer = self._build(encoders.build_tokenizer, encoders.TOKENIZER_REGISTRY, settings.tokenizer,
                                     "--tokenizer", lang)

    @staticmethod
    def _build(build, registry, section: dict | None, flag: str, lang: str):
        from omegaconf import OmegaConf

        if not section:
            return None
        name = section.get("_name")
        if name not in registry:
            raise SettingsError(f"unknown {flag} {name!r}: fairseq knows {', '.join(sorted(registry))}")
        fields = getattr(_dataclasses(flag[2:]).get(name), "__dataclass_fields__", {})
        if any(key in _LANGUAGE_OPTIONS for key in fields):
            section = {**section, **{key: lang for key in _LANGUAGE_OPTIONS}}
        try:
            return build(OmegaConf.create(section), from_checkpoint=True)
        except ImportError as err:
            raise SettingsError(f"{flag} {name}: {err}") from None

    def encode(self, line: str) -> str:
        """Plain text to the teacher's tokens, as fairseq-interactive encodes its input."""
        if self.settings.post_process and not self.bpe:
            raise SettingsError(f"--post-process {self.settings.post_process} only undoes a BPE; encoding raw text "
                                "needs the BPE itself: pass --bpe NAME with its model (e.g. --bpe subword_nmt "
                                "--bpe-codes CODES), or give binarized data (--data)")
        if self.tokenizer is not None:
            line = self.tokenizer.encode(line)
        if self.bpe is not None:
            line = self.bpe.encode(line)
        return line

    def decode(self, tokens: str) -> str:
        """The teacher's tokens (space-separated) to plain text, as fairseq-generate's D- lines."""
        from fairseq.data.data_utils import post_process

        if self.settings.post_process:
            tokens = post_process(tokens, self.settings.post_process)
        if self.bpe is not None:
            tokens = self.bpe.decode(tokens)
        if self.tokenizer is not None:
            tokens = self.tokenizer.decode(tokens)
        return tokens

    def encode_all(self, lines: list[str]) -> list[str]:
        return [self.encode(line) for line in lines]

    def decode_all(self, lines: list[str]) -> list[str]:
        return [self.decode(line) for line in lines]


# -- the command line: fairseq's own options, two stages as fairseq parses them ---------------------------------

def add_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """--bpe, --tokenizer, --post-process, --spm-model; and the options of the chosen --bpe and --tokenizer, from
    their fairseq dataclasses (``--bpe subword_nmt`` adds ``--bpe-codes``), as fairseq's own parsers add them."""
    from fairseq.data import encoders
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    group = parser.add_argument_group(
        "detokenization (fairseq's --bpe/--tokenizer/--post-process; default: the teacher checkpoint's)")
    group.add_argument("--bpe", choices=sorted(encoders.BPE_REGISTRY) + ["none"],
                       help="the BPE of the teacher's tokens; its own options follow it, e.g. --bpe subword_nmt "
                            "--bpe-codes CODES, --bpe sentencepiece --sentencepiece-model M.model")
    group.add_argument("--tokenizer", choices=sorted(encoders.TOKENIZER_REGISTRY) + ["none"],
                       help="word tokenizer under the BPE, e.g. moses (sacremoses; languages: the teacher's)")
    group.add_argument("--post-process", metavar="SYMBOL",
                       help="fairseq's --post-process/--remove-bpe (subword_nmt, sentencepiece, @@ , ...): undoes "
                            "a BPE without its model (binarized input only)")
    group.add_argument("--spm-model", help="sentencepiece model: the same as --bpe sentencepiece "
                                           "--sentencepiece-model FILE")
    known, _ = _choices_parser().parse_known_args(argv)
    for registry, choice in ((_dataclasses("bpe"), known.bpe), (_dataclasses("tokenizer"), known.tokenizer)):
        if choice in registry:
            sub = argparse.ArgumentParser(add_help=False)
            gen_parser_from_dataclass(sub, registry[choice](), delete_default=True)
            for action in sub._actions:
                if action.dest in _LANGUAGE_OPTIONS:  # the teacher's languages (see Tokenization)
                    continue
                action.default, action.required = None, False
                action.container = group
                group._add_action(action)


def _dataclasses(kind: str) -> dict:
    """fairseq's registry of the configuration dataclasses of each ``--bpe`` or ``--tokenizer``."""
    from fairseq import registry
    from fairseq.data import encoders  # noqa: F401  (registers them)

    return registry.REGISTRIES[kind]["dataclass_registry"]


def _choices_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--bpe")
    p.add_argument("--tokenizer")
    return p


def settings_from_args(args) -> TokenizationSettings | None:
    """The settings the command line gives; None if it gives none (then the checkpoint's apply)."""
    if args.spm_model and args.bpe:
        raise SettingsError("--spm-model is --bpe sentencepiece --sentencepiece-model FILE: pass one or the other")
    if args.spm_model:
        return TokenizationSettings.sentencepiece(args.spm_model)
    if not (args.bpe or args.tokenizer or args.post_process):
        return None
    sections = {}
    for name, choice in (("bpe", args.bpe), ("tokenizer", args.tokenizer)):
        registry = _dataclasses(name)
        if not choice or choice == "none":
            continue
        section = {"_name": choice}
        if choice in registry:
            defaults = registry[choice]()
            for key in defaults.__dataclass_fields__:
                value = getattr(args, key, None)
                if value is not None and key not in _LANGUAGE_OPTIONS:
                    section[key] = value
                elif getattr(defaults, key) == "???":  # fairseq's MISSING: a mandatory option
                    raise SettingsError(f"--{name} {choice} needs --{key.replace('_', '-')}")
        sections[name] = section
    post = args.post_process if args.post_process not in (None, "none") else None
    return TokenizationSettings(post_process=post, **sections)
