"""Published teachers: a model folder a user already has, decoded by CTranslate2 with the teacher's own tokenizer.

    a CTranslate2 folder     model.bin, its vocabulary (shared_vocabulary.json, or source_ and
                             target_vocabulary.json; .txt in older conversions) and the sentencepiece models
                             shipped beside it: source.spm and target.spm (OPUS-MT conversions), or one shared
                             model (sentencepiece.bpe.model, sentencepiece.model, spm.model)
    a Hugging Face folder    config.json whose model_type is marian (MarianMT, OPUS-MT) or m2m_100 (M2M100,
                             NLLB), with its tokenizer files; converted once by CTranslate2's own
                             TransformersConverter into the conversion cache, keyed by the folder's content hash

Either way the teacher reads and writes its own tokens: the Hugging Face tokenizer (AutoTokenizer) of the
folder, or the sentencepiece models of a CTranslate2 folder. Multilingual teachers take language codes (NLLB:
eng_Latn, deu_Latn; M2M100: en, de): the source starts with the source language's token, as the teacher's
tokenizer writes it, and decoding starts from the target language's token (CTranslate2's target prefix). The
token is the tokenizer's own (M2M100: __de__, never the plain piece de that its vocabulary also holds); a
CTranslate2 folder has no such tokenizer: there it is __de__, else the code itself (NLLB), and never a piece
that its sentencepiece models write for text.
Inside the generator the teacher's tokens are ids of a fairseq Dictionary built from its vocabulary, so the
corpus, the batching and the output work as for a fairseq teacher.
"""
from __future__ import annotations

import hashlib
import json
import logging
import struct
from pathlib import Path

from nat_kd import atomic
from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file, sha256_json

logger = logging.getLogger("nat_kd.generate_distilled")

MODEL_TYPES = {"marian": "MarianMT", "m2m_100": "M2M100 or NLLB"}
MULTILINGUAL = ("m2m_100",)
SHARED_SENTENCEPIECE = ("sentencepiece.bpe.model", "sentencepiece.model", "spm.model")
# the vocabulary files of each model type's tokenizers (MarianTokenizer; M2M100Tokenizer, NLLB's tokenizers):
# a folder with none of them has the weights alone
TOKENIZER_FILES = {"marian": ("source.spm", "target.spm", "vocab.json"),
                   "m2m_100": ("sentencepiece.bpe.model", "vocab.json", "tokenizer.json")}
# a CTranslate2 model.bin without a position table (CTranslate2 then computes sinusoidal positions itself), or
# in a format model_positions does not read: the fewest of the supported families (MarianMT's 512; M2M100 and
# NLLB have 1024), so that no source runs past them
DEFAULT_MAX_POSITIONS = 512
# model.bin's versions whose variables model_positions reads: a name, rank, shape, type and byte count each since
# version 4 (CTranslate2's models/model.cc); CTranslate2 4.x writes 6
MODEL_BIN_VERSIONS = range(4, 7)


def is_published(path: str | Path) -> bool:
    """A model folder (published teacher), not a fairseq checkpoint file."""
    return Path(path).is_dir()


def folder_sha256(path: Path) -> str:
    """A folder's files: their names relative to it, and their bytes."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def _read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SettingsError(f"{path}: cannot read the {what} ({err})") from None


def _vocabulary(model_dir: Path, side: str) -> list[str]:
    """A CTranslate2 model's vocabulary of one side ("source" or "target")."""
    for name in (f"{side}_vocabulary", "shared_vocabulary"):
        if (model_dir / f"{name}.json").is_file():
            return json.loads((model_dir / f"{name}.json").read_text(encoding="utf-8"))
        if (model_dir / f"{name}.txt").is_file():
            return (model_dir / f"{name}.txt").read_text(encoding="utf-8").rstrip("\n").split("\n")
    raise SettingsError(f"{model_dir} has no vocabulary (shared_vocabulary.json, or source_vocabulary.json and "
                        "target_vocabulary.json): is it a complete CTranslate2 translation model?")


def model_positions(model_bin: Path) -> int | None:
    """The positions of a CTranslate2 model: the rows of its smallest position table in ``model_bin`` (a
    converted MarianMT or M2M100 stores its own), or None if it holds none or has another version.

    The layout is CTranslate2's ModelSpec._serialize: version, spec name, revision, then each variable as
    name, rank, shape, type, byte count and bytes. Only the headers are read: the bytes are skipped."""
    def number(file, fmt: str) -> int:
        return struct.unpack(fmt, file.read(struct.calcsize(fmt)))[0]

    def string(file) -> str:
        return file.read(number(file, "H"))[:-1].decode("utf-8")

    rows = []
    with open(model_bin, "rb") as file:
        if number(file, "I") not in MODEL_BIN_VERSIONS:
            return None
        string(file), number(file, "I")  # the spec's name and revision
        for _ in range(number(file, "I")):
            name = string(file)
            shape = [number(file, "I") for _ in range(number(file, "B"))]
            number(file, "B")  # the type
            file.seek(number(file, "I"), 1)
            if name.endswith("position_encodings/encodings") and len(shape) == 2:
                rows.append(shape[0])
    return min(rows, default=None)


def _dictionary(tokens: list[str]):
    """A fairseq Dictionary over ``tokens`` (its <s>, <pad>, </s>, <unk> merge with fairseq's own)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for token in tokens:
        dictionary.add_symbol(token)
    return dictionary


def _sentencepiece(path: Path):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(path))


def _transformers():
    try:
        import transformers
    except ImportError:
        raise SettingsError("a Hugging Face teacher needs transformers: pip install 'nat-kd[huggingface]'") from None
    return transformers


class Codec:
    """Text <-> the teacher's tokens for one side, as tokenization.Tokenization (encode_all, decode_all). An
    empty line has no tokens (not even a language token): the generator leaves it out, as for any teacher."""

    def __init__(self, encode, decode):
        self.encode, self.decode = encode, decode

    def encode_all(self, lines: list[str]) -> list[str]:
        return [self.encode(line) if line.strip() else "" for line in lines]

    def decode_all(self, lines: list[str]) -> list[str]:
        return [self.decode(line) for line in lines]


class PublishedTeacher:
    """A published model folder as the generator's teacher (see the module doc). Holds what a fairseq
    TeacherEnsemble holds for the generator (paths, languages, dictionaries, max_positions, describe) plus
    the CTranslate2 model folder, the target prefix and the teacher's own codecs."""

    def __init__(self, path: str | Path, cache: str | Path, languages: tuple[str, str],
                 codes: tuple[str | None, str | None] = (None, None)):
        self.path = Path(path)
        self.paths = [str(self.path)]
        self.source_lang, self.target_lang = languages
        self.codes = codes
        self.sha256 = folder_sha256(self.path)
        if (self.path / "model.bin").is_file():
            self.kind, self.model_type, self.model_dir = "ctranslate2", None, self.path
            self.sentencepiece_files = self._sentencepiece_files()
            self.sentencepiece = [_sentencepiece(p) for p in self.sentencepiece_files]
            # what the sentencepiece models write for text; the vocabulary's other tokens are special (EOS,
            # <unk>, language tokens, M2M100's made-up words), as they are to a Hugging Face tokenizer
            self.text_pieces = {model.id_to_piece(i) for model in self.sentencepiece
                                for i in range(model.get_piece_size())
                                if not (model.is_unknown(i) or model.is_control(i))}
            positions = model_positions(self.model_dir / "model.bin") or DEFAULT_MAX_POSITIONS
        elif (self.path / "config.json").is_file():
            config = _read_json(self.path / "config.json", "Hugging Face model configuration")
            self.kind, self.model_type = "transformers", config.get("model_type")
            if self.model_type not in MODEL_TYPES:
                raise SettingsError(f"{self.path / 'config.json'}: model_type {self.model_type!r} is not supported; "
                                    f"supported: {', '.join(f'{k} ({v})' for k, v in MODEL_TYPES.items())}")
            # before the conversion, which loads the tokenizer too and fails less clearly
            self.tokenizer = self._tokenizer()
            self.model_dir = self._converted(Path(cache))
            positions = config.get("max_position_embeddings", DEFAULT_MAX_POSITIONS)
        else:
            raise SettingsError(f"--teacher-path {self.path} is a folder without model.bin (CTranslate2) or "
                                "config.json (Hugging Face): give a fairseq checkpoint or one of those folders")
        self.ct2_config = _read_json(self.model_dir / "config.json", "CTranslate2 model configuration") \
            if (self.model_dir / "config.json").is_file() else {}
        self.eos = self.ct2_config.get("eos_token", "</s>")
        vocabularies = (_vocabulary(self.model_dir, "source"), _vocabulary(self.model_dir, "target"))
        self.src_dict, self.tgt_dict = (_dictionary(v) for v in vocabularies)
        self.target_vocabulary = vocabularies[1]  # the model's output ids' tokens
        self.source_prefix, self.target_prefix = self._language_tokens(*vocabularies)
        self.max_positions = (positions, positions)
        self.codecs = self._transformers_codecs() if self.kind == "transformers" else self._sentencepiece_codecs()
        self.dict_dir = self._dictionaries(Path(cache))

    # -- conversion and files ------------------------------------------------------------------------------------

    def _converted(self, cache: Path) -> Path:
        """The Hugging Face model in CTranslate2's format, converted on first use into ``cache``."""
        import ctranslate2
        from ctranslate2.converters import TransformersConverter

        transformers = _transformers()

        key = sha256_json({"teacher": self.sha256, "ctranslate2": ctranslate2.__version__,
                           "transformers": transformers.__version__})

        def build(work: Path) -> None:
            logger.info("converting %s to CTranslate2 into %s", self.path, cache / key[:32])
            try:
                TransformersConverter(str(self.path)).convert(str(work), force=True)
            except (ValueError, NotImplementedError, KeyError, OSError) as err:
                raise SettingsError(f"CTranslate2 {ctranslate2.__version__} cannot convert {self.path}: {err}") \
                    from None
            atomic.write_json(work / "nat_kd_source.json", {"teacher": str(self.path.resolve()), "key": key})

        return atomic.build_once(cache / key[:32], build)

    def _dictionaries(self, cache: Path) -> Path:
        """dict.SRC.txt and dict.TGT.txt (fairseq's format) of the teacher's vocabulary, for bin/."""
        key = sha256_json({"teacher": self.sha256, "languages": [self.source_lang, self.target_lang]})

        def build(work: Path) -> None:
            self.src_dict.save(str(work / f"dict.{self.source_lang}.txt"))
            self.tgt_dict.save(str(work / f"dict.{self.target_lang}.txt"))

        return atomic.build_once(cache / f"dictionaries-{key[:32]}", build)

    # -- languages and tokenizers --------------------------------------------------------------------------------

    @property
    def multilingual(self) -> bool:
        if self.kind == "transformers":
            return self.model_type in MULTILINGUAL
        return any(code is not None for code in self.codes)

    def _language_tokens(self, source_vocabulary: list[str], target_vocabulary: list[str]):
        """The source's first token and the target prefix: a language code's token (NLLB: the code itself,
        M2M100: __code__), or none for a bilingual teacher (see the module doc)."""
        src, tgt = self.codes
        if self.kind == "transformers" and not self.multilingual:
            if src or tgt:
                raise SettingsError(f"teacher {self.path} ({MODEL_TYPES[self.model_type]}) translates one language "
                                    "pair: drop --teacher-src-lang/--teacher-tgt-lang")
            return [], []
        if not self.multilingual:
            return [], []
        if not (src and tgt):
            raise SettingsError(f"teacher {self.path} is multilingual: give --teacher-src-lang and "
                                "--teacher-tgt-lang (e.g. eng_Latn and deu_Latn for NLLB, en and de for M2M100)")

        if self.kind == "transformers":
            tokens = [self._tokenizer_language(src, "--teacher-src-lang"),
                      self._tokenizer_language(tgt, "--teacher-tgt-lang")]
            # the tokenizer writes the source language's token itself, and the target's in a reference
            self.tokenizer.src_lang, self.tokenizer.tgt_lang = src, tgt
            return [tokens[0]], [tokens[1]]
        return ([self._vocabulary_language(src, source_vocabulary, "--teacher-src-lang")],
                [self._vocabulary_language(tgt, target_vocabulary, "--teacher-tgt-lang")])

    def _tokenizer_language(self, code: str, flag: str) -> str:
        """The language token of ``code`` as the tokenizer defines it: M2M100's maps its codes to tokens
        (lang_code_to_id, get_lang_token: de -> __de__), NLLB's codes are its additional special tokens."""
        tokenizer = self.tokenizer
        if hasattr(tokenizer, "lang_code_to_id"):
            codes, token = list(tokenizer.lang_code_to_id), tokenizer.get_lang_token
        else:
            codes, token = list(tokenizer.additional_special_tokens), str
        if code not in codes:
            piece = f" ({code} is a piece of its vocabulary, not a language)" if code in tokenizer.get_vocab() else ""
            raise SettingsError(f"{flag} {code}: not a language code of teacher {self.path}{piece}; give one of "
                                f"its tokenizer's {len(codes)} codes: {', '.join(codes[:8])}, ...")
        return token(code)

    def _vocabulary_language(self, code: str, vocabulary: list[str], flag: str) -> str:
        """The language token of ``code`` in a CTranslate2 folder's vocabulary: __code__ (M2M100), else the
        code (NLLB); never a piece that the sentencepiece models write for text."""
        for candidate in (f"__{code}__", code):
            if candidate in vocabulary and candidate not in self.text_pieces:
                return candidate
        piece = f" ({code} is a piece of its sentencepiece model, not a language)" if code in vocabulary else ""
        raise SettingsError(f"{flag} {code}: neither __{code}__ nor a language token {code} is in the vocabulary "
                            f"of teacher {self.path}{piece}; give one of its language codes")

    def _tokenizer(self):
        """The folder's AutoTokenizer (the codes are set once checked: _language_tokens)."""
        files = TOKENIZER_FILES[self.model_type]
        if not any((self.path / name).is_file() for name in files):
            raise SettingsError(f"teacher {self.path} has the model's weights but none of its tokenizer's files "
                                f"({', '.join(files)}): copy them into the folder from where the model came from "
                                "(tokenizer.save_pretrained(FOLDER) writes them)")
        return _transformers().AutoTokenizer.from_pretrained(str(self.path))

    def _transformers_codecs(self) -> tuple[Codec, Codec]:
        tokenizer = self.tokenizer

        def tokens(ids: list[int]) -> str:
            pieces = tokenizer.convert_ids_to_tokens(ids)
            return " ".join(pieces[:-1] if pieces and pieces[-1] == tokenizer.eos_token else pieces)

        def decode(line: str) -> str:  # as the tokenizer decodes the model's output ids
            return tokenizer.decode(tokenizer.convert_tokens_to_ids(line.split()), skip_special_tokens=True)

        # the source as the tokenizer writes a model input (the source language's token first, EOS last: EOS
        # is appended to every sentence again when it is decoded); the target only gives the references' lengths
        return (Codec(lambda line: tokens(tokenizer(line).input_ids), decode),
                Codec(lambda line: tokens(tokenizer(text_target=line).input_ids), decode))

    def _sentencepiece_files(self) -> list[Path]:
        """The source's and the target's sentencepiece model beside model.bin."""
        pair = [self.path / "source.spm", self.path / "target.spm"]
        if all(p.is_file() for p in pair):
            return pair
        shared = [self.path / name for name in SHARED_SENTENCEPIECE if (self.path / name).is_file()]
        if not shared:
            raise SettingsError(f"teacher {self.path}: no sentencepiece model beside model.bin (source.spm and "
                                f"target.spm, or one of {', '.join(SHARED_SENTENCEPIECE)})")
        return [shared[0], shared[0]]

    def _sentencepiece_codecs(self) -> tuple[Codec, Codec]:
        def decode(line: str) -> str:
            # fairseq's (and Hugging Face's) reading of pieces: "▁" starts a word; special tokens are left out
            # (the tokenizer's skip_special_tokens). Not the model's decode_pieces, which keeps the "▁" of a
            # piece it does not know: a shared vocabulary holds the other language's pieces too
            return "".join(t for t in line.split() if t in self.text_pieces).replace("▁", " ").strip()

        def codec(model, prefix: list[str]) -> Codec:
            return Codec(lambda line: " ".join(prefix + model.encode(line, out_type=str)), decode)

        return codec(self.sentencepiece[0], self.source_prefix), codec(self.sentencepiece[1], self.target_prefix)

    # -- what the generator records ------------------------------------------------------------------------------

    def describe(self) -> dict:
        import ctranslate2

        about = {"name": self.path.name, "checkpoints": [str(self.path.resolve())], "kind": self.kind,
                 "arch": [self.model_type or "ctranslate2"], "sha256": [self.sha256], "parameters": None, "source_lang": self.source_lang, "target_lang": self.target_lang,
                 "language_codes": list(self.codes) if self.multilingual else None,
                 "target_prefix": self.target_prefix, "dictionary_size": len(self.tgt_dict),
                 "max_positions": list(self.max_positions), "ctranslate2_model": str(self.model_dir)}
        if self.kind == "transformers":
            import transformers

            about.update(model_type=self.model_type, tokenizer=type(self.tokenizer).__name__,
                         converter="ctranslate2.converters.TransformersConverter",
                         converter_version=ctranslate2.__version__, transformers_version=transformers.__version__)
        else:
            about.update(tokenizer="sentencepiece", tokenizer_files=[str(p) for p in self.sentencepiece_files],
                         converter=None, converter_version=None)
        return about

    @property
    def tokenization(self) -> OwnTokenization:
        return OwnTokenization({"teacher_tokenizer": self.describe()["tokenizer"], "detokenized": True})


class OwnTokenization:
    """A published teacher's tokenization as the generator records it (tokenization.TokenizationSettings'
    describe and fingerprint): its tokenizer's files are part of the teacher's content hash already."""

    def __init__(self, description: dict):
        self.description = description

    def describe(self) -> dict:
        return self.description

    def fingerprint(self) -> dict:
        return {"tokenization": self.description}
