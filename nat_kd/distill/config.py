"""``DistillConfig``: every setting of a distillation, as plain values (the command line builds one, and
``pipeline.distill`` runs it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nat_kd.errors import SettingsError
from nat_kd.tokenization import TokenizationSettings

from .decoding import DecodingSettings


@dataclass
class DistillConfig:
    teachers: list[str]
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
    max_tokens: int = 12000  # fairseq-generate's default
    max_sentences: int | None = None
    chunk_sentences: int = 500
    num_shards: int | None = None  # default: torchrun's WORLD_SIZE, else 1
    shard_id: int | None = None  # default: torchrun's RANK, else 0
    merge_only: bool = False
    workers: int = 0  # decoding processes on this machine; 0: one per available core (CPU), 1 on GPU
    threads: int = 0  # torch threads per worker; 0: cores / workers
    device: str = "auto"  # "cpu", "cuda", or auto
    progress_bar: bool = True
    backend: str = "fairseq"  # or "ctranslate2" (nat_kd/distill/backends)
    compute_type: str = "float32"  # ctranslate2: float32, int8, int8_float32; on a GPU also float16, bfloat16
    fp16: bool = False  # fairseq on a GPU: the teacher in half precision
    ct2_cache: str | None = None  # ctranslate2: converted teachers (default: OUT/../.ctranslate2-cache)
    keep_empty_lines: bool = False  # bin/ keeps the (empty, empty) pairs of empty sources too
    check_against_fairseq: int = 0  # at the merge: decode this many sentences with the fairseq backend too

    def check(self) -> None:
        """Options that do not fit together."""
        if self.backend != "ctranslate2" and self.compute_type != "float32":
            raise SettingsError(f"--compute-type {self.compute_type} is for --backend ctranslate2; the fairseq "
                                "backend takes --fp16 (on a GPU)")
        if self.check_against_fairseq and self.backend == "fairseq":
            raise SettingsError("--check-against-fairseq compares another backend with fairseq: add --backend "
                                "ctranslate2")
        if self.backend != "fairseq" and self.fp16:
            raise SettingsError("--fp16 is for the fairseq backend; with --backend ctranslate2 use --compute-type "
                                "float16 (or bfloat16) on a GPU")

    def conversion_cache(self) -> Path:
        """Where converted teachers are kept: ct2_cache, else beside the output folder (shared by every
        distilled set written there, so each teacher is converted once)."""
        return Path(self.ct2_cache) if self.ct2_cache else Path(self.out_dir).resolve().parent / ".ctranslate2-cache"

    def __post_init__(self):
        if self.spm_model is not None:
            if self.tokenization is not None:
                raise SettingsError("spm_model is a shortcut for tokenization=TokenizationSettings.sentencepiece(...): "
                                    "give one of the two")
            self.tokenization = TokenizationSettings.sentencepiece(self.spm_model)
            self.spm_model = None
