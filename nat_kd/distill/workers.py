"""The decoding processes: what each one loads (``Session``), how it decodes a chunk (``ChunkDecoder``), and the
pool that runs them (one per core on a CPU; on a GPU one, or ``--workers`` sharing it), each saving its chunks as
they finish.

Workers are spawned, not forked: each loads its own teacher, and nothing is inherited from a threaded parent.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from nat_kd.analysis.metrics.sentence import SentenceScorer, sacrebleu_statistics
from nat_kd.cli import quiet_worker
from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file
from nat_kd.machine import available_cores

from .autobatch import AUTO, AutoBatching
from .backends import BackendInputs, BackendSettings, backend_class, build_backend
from .config import DistillConfig
from .decoding import build_strategy
from .progress import PROGRESS_VERSION, ChunkStore
from .scores import statistics
from .source import load_corpus
from .student import StudentData
from .teachers import PublishedTeacher


def choose_device(cfg: DistillConfig) -> str:
    import torch

    if cfg.device == "auto":
        if torch.cuda.is_available():
            return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        return "cpu"
    return cfg.device


def parallelism(cfg: DistillConfig, device: str) -> tuple[int, int]:
    """(worker processes, torch threads per worker) on this machine."""
    if device != "cpu":
        # --workers N: N processes share the GPU, each with its own teacher; a small teacher's beam search leaves
        # the GPU idle between its steps (Python and small kernels), which the other processes fill
        return cfg.workers or 1, cfg.threads or 1
    # under torchrun, the ranks on this machine share its cores
    cores = max(1, available_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    # CTranslate2: one process, one model replica per core decoding sub-batches side by side (faster than
    # processes on 2 cores, docs/generate_distilled.md); fairseq: one single-threaded process per core
    workers = cfg.workers or (1 if cfg.backend == "ctranslate2" else cores)
    return workers, cfg.threads or max(1, cores // workers)


class Session:
    """Everything loaded once per process: teacher, its encoders (tokenization.py), corpus, fairseq dataset,
    chunk plan; and what the backend is given of them (``backend_settings``, ``backend_inputs``)."""

    def __init__(self, cfg: DistillConfig, device: str = "cpu"):
        self.cfg, self.device = cfg, device
        self.auto: AutoBatching | None = None  # what --max-tokens auto chose (set by pipeline.distill)
        if cfg.backend == "ctranslate2":  # before a published teacher's folder imports ctranslate2 as it loads
            from .backends.ctranslate2 import load_pip_cublas

            load_pip_cublas(device)
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
            cache=str(cfg.conversion_cache()))
        self.backend_inputs = BackendInputs(self.teacher, self.corpus.source_tokens, self.dataset)
        if device != "cpu" and cfg.backend == "fairseq":
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
            self._fingerprint = {
                "progress_version": PROGRESS_VERSION, "teachers": [self.teacher.sha256] if isinstance(self.teacher, PublishedTeacher)
                else [sha256_file(p) for p in cfg.teachers],
                "backend": backend_class(cfg.backend).describe(self.backend_settings),
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
        converted = self.cfg.backend == "ctranslate2"
        return {**self.teacher.describe(), "name": Path(self.cfg.teachers[0]).name,
                "sha256": self.fingerprint()["teachers"],
                "parameters": sum(p.numel() for model in self.teacher.models for p in model.parameters()),
                "converter": "ctranslate2.converters.FairseqConverter" if converted else None,
                "converter_version": backend_class("ctranslate2").describe(self.backend_settings)[
                    "ctranslate2_version"] if converted else None}

    def decoder(self, threads: int = 1) -> ChunkDecoder:
        return ChunkDecoder(self, threads)


class ChunkDecoder:
    """Decodes chunks of the corpus batch by batch with the configured backend (``backends``), keeps one
    hypothesis per sentence (the strategy's rule) and detokenizes. Empty sources are not decoded: their
    target is empty."""

    def __init__(self, session: Session, threads: int = 1, backend=None):
        self.strategy, self.references = session.strategy, session.corpus.references
        self.codec = session.codecs[1]
        if self.strategy.needs_reference and self.references is None:
            raise SettingsError(f"{self.strategy.name} needs the references (--reference)")
        self.empty = {line - 1 for line in session.corpus.empty_lines}
        self.backend = backend or build_backend(session.backend_settings, session.backend_inputs, threads)
        self.scorer = SentenceScorer()
        self._last_finish = 0.0

    def decode_batch(self, ids: list[int]) -> list[tuple[int, str, float]]:
        """(sentence id, pieces of the kept hypothesis, its length-normalised log-probability: the backend's
        ``Hypothesis.logprob``) for each sentence of one batch; an empty source gets an empty target and a NaN
        log-probability (nothing was decoded)."""
        return self._finish_batch(self._submit_batch(ids))

    def _submit_batch(self, ids: list[int]):
        empty = [(i, "", math.nan) for i in ids if i in self.empty]
        decoding = [i for i in ids if i not in self.empty]
        return empty, (self.backend.submit(decoding) if decoding else None)

    def _finish_batch(self, pending) -> list[tuple[int, str, float]]:
        out, decoding = pending
        for sentence_id, nbest in (decoding.result() if decoding else []):
            best = nbest[0]
            if self.strategy.needs_reference:
                texts = self.codec.decode_all([h.pieces for h in nbest])
                best = nbest[self.strategy.choose(texts, self.references[sentence_id])]
            out.append((sentence_id, best.pieces, best.logprob))
        return out

    def decode_chunk(self, batches: list[list[int]]) -> dict:
        """The chunk's sentences in id order: pieces, text and log-probability; with references, the chunk's
        summed BLEU/chrF statistics (see scores); and each line's scores (nat_kd.analysis.metrics.sentence)."""
        return self.finish_chunk(self.submit_chunk(batches))

    def submit_chunk(self, batches: list[list[int]]):
        """Queue the chunk's batches on the backend; ``finish_chunk`` waits for them and builds the chunk."""
        return time.perf_counter(), [self._submit_batch(batch) for batch in batches]

    def finish_chunk(self, pending) -> dict:
        """The chunk (see decode_chunk). Its ``seconds`` run from its submission or the previous chunk's
        finish, whichever came later, so that the chunks' seconds add up to the decoding's wall time."""
        submitted, batches = pending
        start = max(submitted, self._last_finish)
        results = sorted(row for batch in batches for row in self._finish_batch(batch))
        chunk = {"ids": [i for i, _, _ in results], "pieces": [p for _, p, _ in results]}
        chunk["text"] = self.codec.decode_all(chunk["pieces"])
        references, per_line = None, None
        if self.references is not None:
            references = [self.references[i] for i in chunk["ids"]]
            per_line = sacrebleu_statistics(chunk["text"], references)
            chunk["statistics"] = statistics(chunk["text"], references, per_line)
        scores = self.scorer.score(chunk["text"], references, per_line, [lp for _, _, lp in results])
        chunk["scores"] = {name: values.tolist() for name, values in scores.columns.items()}
        self._last_finish = time.perf_counter()
        chunk["seconds"] = round(self._last_finish - start, 3)
        return chunk

    def close(self) -> None:
        """Stop the backend's own threads, if it has any (``close``: the fairseq backend's, on a GPU)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


def reuse_freed_memory() -> None:
    """Serve big tensors from the heap and keep freed memory for reuse (glibc only).

    A beam step's scores are B*beam x V floats (about 40 MB at 3000 tokens, vocabulary 8k): above glibc's
    largest mmap threshold, so every step maps fresh pages that the kernel must zero, and two decoding
    processes then compete for memory bandwidth. With mmap off and no trimming, each step reuses the last
    step's pages; a worker keeps its peak memory until it exits (docs/generate_distilled.md: what it saves).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "mallopt"):
        m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
        libc.mallopt(m_mmap_max, 0)
        libc.mallopt(m_trim_threshold, 2**31 - 1)


class OutOfGPUMemory(SettingsError):
    """The decoding did not fit the GPU's memory: the settings to lower, and that the saved chunks are kept."""


def out_of_gpu_memory(err: BaseException, cfg: DistillConfig, device: str, workers: int) -> OutOfGPUMemory | None:
    """``err`` as an OutOfGPUMemory if it is torch's or CTranslate2's out-of-memory error, else None."""
    import torch

    if not (isinstance(err, torch.cuda.OutOfMemoryError)
            or (isinstance(err, RuntimeError) and "CUDA failed with error out of memory" in str(err))):
        return None
    if cfg.max_tokens == AUTO:  # a bound that did not hold (autobatch.py)
        return OutOfGPUMemory(
            f"out of GPU memory on {device}, decoding the batches --max-tokens auto sized (plan.json's batching "
            f"in {cfg.out_dir}.partial) in {workers} process(es) on it; the chunks saved so far are kept. Rerun "
            "with fewer --workers to go on from them, or start again in smaller batches: --max-tokens a number "
            "below auto's and another --out")
    return OutOfGPUMemory(
        f"out of GPU memory on {device}, decoding batches of up to --max-tokens {cfg.max_tokens} tokens in "
        f"{workers} process(es) on it; the chunks saved so far are kept. Rerun with fewer --workers to go on "
        "from them, or start again in smaller batches: a smaller --max-tokens and another --out")


_WORKER = {}  # this worker process's ChunkDecoder, and what its out-of-memory error says


def _worker_init(cfg: DistillConfig, threads: int, device: str, workers: int) -> None:
    import torch

    torch.set_num_threads(threads)
    reuse_freed_memory()
    _WORKER["decoder"] = Session(cfg, device).decoder(threads)
    _WORKER["settings"] = (cfg, device, workers)


def _worker_decode(job):
    index, batches = job
    try:
        return index, _WORKER["decoder"].decode_chunk(batches)
    except Exception as err:
        # torch's error may not survive the pickling back to the parent; ours does, and reads as one line
        memory = out_of_gpu_memory(err, *_WORKER["settings"])
        if memory is None:
            raise
        raise memory from None


def decode_pending(session: Session, store: ChunkStore, chunks, pending: list[int], workers: int,
                   threads: int, shard_label: str) -> int:
    """Decode the ``pending`` chunks, saving each as it finishes; returns the number of sentences decoded."""
    from tqdm import tqdm

    total = sum(len(b) for i in pending for b in chunks[i])
    bar = tqdm(total=total, unit="sent", desc=f"distil {shard_label}", disable=not session.cfg.progress_bar,
               dynamic_ncols=True, file=sys.stderr)
    jobs = [(i, chunks[i]) for i in pending]
    try:
        if workers <= 1 or len(jobs) <= 1:
            import torch

            torch.set_num_threads(threads)
            reuse_freed_memory()
            decoder = session.decoder(threads)
            # the next chunk is queued before this one is finished, so a backend that decodes in its own
            # threads (CTranslate2; fairseq on a GPU) keeps them busy while this process detokenizes, scores
            # and saves
            def finish(index, submitted):
                result = decoder.finish_chunk(submitted)
                store.save(index, result)
                bar.update(len(result["ids"]))

            try:
                queued = None
                for index, batches in jobs:
                    submitted = (index, decoder.submit_chunk(batches))
                    if queued:
                        finish(*queued)
                    queued = submitted
                if queued:
                    finish(*queued)
            except Exception as err:
                memory = out_of_gpu_memory(err, session.cfg, session.device, 1)
                if memory is None:
                    raise
                raise memory from err
            finally:  # also on an error or Ctrl-C: no decoding thread is left running
                decoder.close()
        else:
            context = multiprocessing.get_context("spawn")
            setup = (_worker_init, (session.cfg, threads, session.device, min(workers, len(jobs))))
            with context.Pool(min(workers, len(jobs)), initializer=quiet_worker,
                              initargs=(pickle.dumps(setup),)) as pool:
                # longest chunks first (chunks are sorted by length), so no worker is left alone at the end
                for index, result in pool.imap_unordered(_worker_decode, jobs[::-1]):
                    store.save(index, result)
                    bar.update(len(result["ids"]))
    finally:
        bar.close()
    return total
