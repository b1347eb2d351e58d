"""``DistillConfig``: every setting of a distillation, as plain values (the command line builds one, and
``pipeline.distill`` runs it)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from nat_kd.errors import SettingsError
from nat_kd.tokenization import TokenizationSettings

from .autobatch import AUTO
from .backends import DEFAULT_BACKEND, PUBLISHED_TEACHER_BACKEND, backend_class, names_carrying_out, names_with
from .decoding import DecodingSettings
from .teachers import is_published


@dataclass
class DistillConfig:
    teachers: list[str]  # fairseq checkpoints (several: an ensemble), or one published model folder (teachers.py)
    out_dir: str
    spm_model: str | None = None  # a shortcut: tokenization=TokenizationSettings.sentencepiece(spm_model)
    split: str = "train"
    source: str | None = None  # raw source text (encoded into the teacher's tokens), or the source text of --data
    data_dir: str | None = None  # fairseq-binarized folder holding SPLIT.SRC-TGT.SRC.{bin,idx}
    reference: str | None = None  # raw reference targets, line-aligned (default: data_dir's target side, decoded)
    # text <-> the teacher's tokens (fairseq's --bpe/--tokenizer/--post-process); None: the checkpoint's
    tokenization: TokenizationSettings | None = None
    dict_dir: str | None = None  # the teacher's dictionaries (default: the folder it was trained on)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    name: str | None = None  # recorded in meta.json (default: the output folder's name)
    max_tokens: int | str | None = None  # "auto": sized to the GPU's memory; None: pipeline.with_batch_default
    max_sentences: int | None = None
    chunk_sentences: int = 500
    num_shards: int | None = None  # default: torchrun's WORLD_SIZE, else 1
    shard_id: int | None = None  # default: torchrun's RANK, else 0
    merge_only: bool = False
    workers: int = 0  # decoding processes on this machine; 0: one per available core (CPU), 1 on a GPU
    threads: int = 0  # torch threads per worker; 0: cores / workers
    device: str = "auto"  # "cpu", "cuda", or auto
    progress_bar: bool = True
    backend: str | None = None  # a registered backend (backends/); None: its default for the teacher
    teacher_src_lang: str | None = None  # a multilingual published teacher's language codes (NLLB: eng_Latn)
    teacher_tgt_lang: str | None = None
    student_data: str | None = None  # a nat_kd.prepare folder: bin/ in the student's tokens (student_vocabulary.py)
    languages: tuple[str, str] | None = None  # the output files' suffixes (default: --source's and --reference's)
    compute_type: str = "float32"  # ctranslate2: float32, int8, int8_float32; on a GPU also float16, bfloat16
    fp16: bool = False  # fairseq on a GPU: the teacher in half precision
    ct2_cache: str | None = None  # converted teachers (default: OUT/../.ctranslate2-cache)
    keep_empty_lines: bool = False  # bin/ keeps the (empty, empty) pairs of empty sources too
    check_against_fairseq: int = 0  # at the merge: decode this many sentences with the fairseq backend too
    check_against_transformers: int = 0  # the same with transformers' generate (a Hugging Face teacher)

    @property
    def published_teacher(self) -> bool:
        return any(is_published(t) for t in self.teachers)

    def file_languages(self) -> tuple[str, str]:
        """The source and target language of the output files (SPLIT.SRC, SPLIT.TGT) of a published teacher,
        whose folder names none: ``languages``, else the suffixes of the source and reference files."""
        if self.languages:
            return tuple(self.languages)
        suffixes = [Path(p).suffix.lstrip(".") if p else "" for p in (self.source, self.reference)]
        if not all(suffixes) or suffixes[0] == suffixes[1]:
            raise SettingsError("a published teacher's output files are named by language: use --prepared, or "
                                "--source and --reference files named like train.en and train.de")
        return suffixes[0], suffixes[1]

    def check(self) -> None:
        """Options that do not fit together, or that the backend does not take (its policy: backends/base.py)."""
        backend = backend_class(self.backend)
        if self.published_teacher:
            if len(self.teachers) > 1:
                raise SettingsError(f"--teacher-path: a model folder is one teacher, not part of an ensemble "
                                    f"({', '.join(self.teachers)})")
            if not backend.decodes_published_teachers:
                raise SettingsError(f"--teacher-path {self.teachers[0]} is a model folder, which the "
                                    f"{PUBLISHED_TEACHER_BACKEND} backend decodes: drop --backend {self.backend}")
            if self.check_against_fairseq:
                raise SettingsError("--check-against-fairseq needs a fairseq teacher; for a Hugging Face teacher "
                                    "use --check-against-transformers")
            if not self.source:
                raise SettingsError("a published teacher reads raw text: give --source (or --prepared)")
        self._check_strategy(backend)
        if not backend.takes_compute_type and self.compute_type != "float32":
            fp16 = f"; the {self.backend} backend takes --fp16 (on a GPU)" if backend.takes_fp16 else ""
            raise SettingsError(f"--compute-type {self.compute_type} is for --backend "
                                f"{' or '.join(names_with('takes_compute_type'))}{fp16}")
        if self.check_against_transformers and not self.published_teacher:
            raise SettingsError("--check-against-transformers compares with a Hugging Face teacher's own generate: "
                                "give its folder as --teacher-path (for a fairseq teacher: --check-against-fairseq)")
        if self.check_against_fairseq and backend.reference:
            raise SettingsError("--check-against-fairseq compares another backend with fairseq: add --backend "
                                + " or ".join(names_with("reference", False)))
        if self.max_tokens == AUTO:
            self._check_auto(backend)
        if self.fp16 and not backend.takes_fp16:
            raise SettingsError(f"--fp16 is for the {' or '.join(names_with('takes_fp16'))} backend"
                                + (f"; with --backend {self.backend} use --compute-type float16 (or bfloat16) on a GPU"
                                   if backend.takes_compute_type else ""))

    def _check_strategy(self, backend) -> None:
        """The strategy is one that the backend carries out; a backend that carries out none decodes its own way,
        and is given no decoding settings but the defaults."""
        strategy = self.decoding.strategy
        if backend.strategies:
            if strategy not in backend.strategies:
                others = names_carrying_out(strategy)
                raise SettingsError(f"--strategy {strategy}: the {self.backend} backend carries out "
                                    f"{', '.join(backend.strategies)}"
                                    + (f"; {strategy} is for --backend {' or '.join(others)}" if others else ""))
            return
        given = [f"--{setting.name.replace('_', '-')}" for setting in fields(DecodingSettings)
                 if getattr(self.decoding, setting.name) != setting.default]
        if given:
            raise SettingsError(f"{', '.join(given)}: the {self.backend} backend decodes its own way, without a "
                                f"strategy or decoding settings; drop {'it' if len(given) == 1 else 'them'}")

    def _check_auto(self, backend) -> None:
        if not backend.max_tokens_auto:
            raise SettingsError(f"--max-tokens auto sizes the {' or '.join(names_with('max_tokens_auto'))} backend's "
                                f"beam search to the GPU's memory; with --backend {self.backend} give --max-tokens a "
                                "number")
        if (self.num_shards or 1) > 1:
            raise SettingsError(f"--max-tokens auto: the {self.num_shards} shards must share one plan of batches, "
                                "and each would size its own to its GPU: give --max-tokens a number (a one-shard "
                                "run's meta.json records what auto chose)")

    def conversion_cache(self) -> Path:
        """Where converted teachers are kept: ct2_cache, else beside the output folder (shared by every
        distilled set written there, so each teacher is converted once)."""
        return Path(self.ct2_cache) if self.ct2_cache else Path(self.out_dir).resolve().parent / ".ctranslate2-cache"

    def __post_init__(self):
        if self.backend is None:
            self.backend = PUBLISHED_TEACHER_BACKEND if self.published_teacher else DEFAULT_BACKEND
        if self.spm_model is not None:
            if self.tokenization is not None:
                raise SettingsError("spm_model is a shortcut for tokenization=TokenizationSettings.sentencepiece(...): "
                                    "give one of the two")
            self.tokenization = TokenizationSettings.sentencepiece(self.spm_model)
            self.spm_model = None
