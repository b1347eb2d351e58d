"""The run as a process has it loaded: the teacher, its encoders, the corpus, fairseq's dataset, the chunk
plan's batches, and what the backend is given of it; the run's fingerprint and meta.json's teacher."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file

from .autobatch import AUTO, AutoBatching
from .backends import BackendInputs, BackendSettings, backend_class
from .config import DistillConfig
from .decoding import build_strategy
from .progress import PROGRESS_VERSION
from .source import load_corpus
from .student_vocabulary import StudentData
from .teachers import PublishedTeacher


class LoadedRun:
    """Everything loaded once per process: teacher, its encoders (tokenization.py), corpus, fairseq dataset,
    chunk plan; and what the backend is given of them (``backend_settings``, ``backend_inputs``)."""

    def __init__(self, cfg: DistillConfig, device: str = "cpu"):
        self.cfg, self.device = cfg, device
        self.backend_type = backend_class(cfg.backend)
        self.auto: AutoBatching | None = None  # what --max-tokens auto chose (set by pipeline.distill)
        self.backend_type.set_up_process(device)
        self.strategy = build_strategy(cfg.decoding)
        if cfg.published_teacher:
            self.teacher = PublishedTeacher(cfg.teachers[0], cfg.conversion_cache(), cfg.file_languages(),
                                            (cfg.teacher_src_lang, cfg.teacher_tgt_lang))
            self.tokenization, self.codecs = self.teacher.tokenization, self.teacher.codecs
            # raw text only: a binarized folder holds another model's token ids
            self.corpus = load_corpus(teacher=self.teacher, codecs=self.codecs, split=cfg.split, source=cfg.source,
                                      reference=cfg.reference)
        else:
            self._load_fairseq_teacher(cfg)
        if self.strategy.needs_reference and self.corpus.references is None:
            raise SettingsError(f"strategy {self.strategy.name} reranks against the reference: pass --reference, "
                                "or binarized data (--data) with the split's target side")
        self.dataset = self._dataset()
        self.backend_settings = BackendSettings(
            name=cfg.backend, decoding=cfg.decoding, device=device, compute_type=cfg.compute_type, fp16=cfg.fp16,
            cache=str(cfg.conversion_cache()) if self.backend_type.converter else None)
        self.backend_inputs = BackendInputs(self.teacher, self.corpus.source_tokens, self.dataset)
        if device != "cpu" and self.backend_type.pytorch_teacher:
            import torch

            self.teacher.to(device, dtype=torch.float16 if cfg.fp16 else None)

    def _load_fairseq_teacher(self, cfg: DistillConfig) -> None:
        from fairseq_plugins.teacher import TeacherEnsemble

        from nat_kd.tokenization import Tokenization, resolve

        self.teacher = TeacherEnsemble.load(cfg.teachers, cfg.dict_dir)
        if cfg.data_dir:
            self.teacher.check_data_folder(cfg.data_dir)
        self.tokenization = resolve(cfg.tokenization, self.teacher.config)
        self.codecs = (Tokenization(self.tokenization, self.teacher.source_lang),
                       Tokenization(self.tokenization, self.teacher.target_lang))
        self.corpus = load_corpus(teacher=self.teacher, codecs=self.codecs, split=cfg.split, source=cfg.source,
                                  data_dir=cfg.data_dir, reference=cfg.reference)

    def _dataset(self):
        """The corpus as the LanguagePairDataset fairseq-generate builds for a binarized split (the translation
        task's load_dataset): same padding, same target sizes, ties shuffled in every split but "test".

        A sentence's hypothesis depends, in its last float bits, on the batch it is decoded in (padding
        changes the order of the sums), so fairseq-generate's hypotheses are only reproduced exactly from
        fairseq-generate's batches: length-sorted by source then reference, counted as max(source, reference)
        tokens. Without references, batches follow the source alone."""
        from fairseq.data import LanguagePairDataset

        task, corpus = getattr(self.teacher, "task", None), self.corpus

        def setting(name, default):
            try:
                return getattr(task.cfg, name, default)
            except Exception:  # an interpolation into the training config that does not resolve here
                return default

        return LanguagePairDataset(
            corpus.source_tokens, np.array([len(t) for t in corpus.source_tokens]), self.teacher.src_dict,
            tgt=None, tgt_sizes=corpus.reference_sizes, tgt_dict=self.teacher.tgt_dict,
            left_pad_source=setting("left_pad_source", True), left_pad_target=setting("left_pad_target", False),
            shuffle=self.cfg.split != "test", num_buckets=setting("num_batch_buckets", 0),
            pad_to_multiple=setting("required_seq_len_multiple", 1))

    def batch_limits(self) -> tuple[int | None, int | None]:
        """(max tokens, max sentences) of a batch: the settings, or what --max-tokens auto chose."""
        if self.auto is not None:
            return self.auto.max_tokens, self.auto.max_sentences
        if self.cfg.max_tokens == AUTO:
            raise SettingsError("--max-tokens auto sizes batches in the run that decodes them, on its GPU: give "
                                "--max-tokens a number here")
        return self.cfg.max_tokens, self.cfg.max_sentences

    def batches(self) -> list[list[int]]:
        """fairseq-generate's own batching (length-sorted, by tokens, its seed), with every sentence kept:
        batch multiple 1, and no size filter (over-long sources were truncated beforehand)."""
        max_tokens, max_sentences = self.batch_limits()
        sizes = self.dataset.num_tokens_vec(np.arange(len(self.corpus)))
        longest = int(sizes.argmax())
        if max_tokens is not None and sizes[longest] > max_tokens:
            raise SettingsError(f"--max-tokens {max_tokens} is smaller than the longest sentence (line "
                                f"{longest + 1}: {sizes[longest]} tokens in the source or the reference); raise "
                                f"--max-tokens to at least {sizes[longest]}")
        if isinstance(self.teacher, PublishedTeacher):
            # what the translation task's get_batch_iterator does below, without a task
            from fairseq.data import data_utils

            with data_utils.numpy_seed(1):
                order = self.dataset.ordered_indices()
            batches = self.dataset.batch_by_size(order, max_tokens=max_tokens, max_sentences=max_sentences,
                                                 required_batch_size_multiple=1)
        else:
            batches = self.teacher.task.get_batch_iterator(
                dataset=self.dataset, max_tokens=max_tokens, max_sentences=max_sentences,
                max_positions=None, ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1,
                num_shards=1, shard_id=0, num_workers=0, disable_iterator_cache=True).frozen_batches
        return [list(map(int, batch)) for batch in batches]

    def fingerprint(self) -> dict:
        """What the output depends on: saved progress and a finished set are reused only if it is unchanged."""
        if not hasattr(self, "_fingerprint"):
            cfg = self.cfg
            published = isinstance(self.teacher, PublishedTeacher)
            self._fingerprint = {
                "progress_version": PROGRESS_VERSION,
                "teachers": [self.teacher.sha256] if published else [sha256_file(p) for p in cfg.teachers],
                "backend": self.backend_type.describe(self.backend_settings),
                "corpus": self.corpus.fingerprint(), "decoding": asdict(cfg.decoding),
                "max_tokens": cfg.max_tokens, "max_sentences": cfg.max_sentences,
                "chunk_sentences": cfg.chunk_sentences, "split": cfg.split, **self.tokenization.fingerprint(),
                "keep_empty_lines": cfg.keep_empty_lines}
            if cfg.student_data:  # absent otherwise: earlier sets keep their fingerprint
                self._fingerprint["student_data"] = StudentData(
                    cfg.student_data, self.teacher.source_lang, self.teacher.target_lang).fingerprint()
        return self._fingerprint

    def describe_teacher(self) -> dict:
        """meta.json's ``teacher``."""
        if isinstance(self.teacher, PublishedTeacher):
            return self.teacher.describe()
        backend = self.backend_type
        return {**self.teacher.describe(), "name": Path(self.cfg.teachers[0]).name,
                "sha256": self.fingerprint()["teachers"],
                "parameters": sum(p.numel() for model in self.teacher.models for p in model.parameters()),
                "converter": backend.converter, "converter_version": backend.converter_version()}
