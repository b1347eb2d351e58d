"""Library API of seq-KD data generation: ``distill(DistillConfig(...)) -> DistillResult``.

Plan: load the teacher(s) and the corpus, batch it as fairseq does (sorted by length, by tokens, nothing
dropped), group batches into chunks, decode the chunks this shard owns (in worker processes, one per core,
each saving its chunk atomically), then -- once every chunk of every shard is there -- merge them into the
output directory. See generate_distilled.py for the command line.
"""
from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import __version__, atomic
from .chunk_store import ChunkStore, ProgressError, plan_chunks, shard_chunks, shard_from_env
from .decoding import DecodingSettings, build_strategy

logger = logging.getLogger("nat_kd.generate_distilled")
# Bump when a change makes old partial progress unusable.
PROGRESS_VERSION = 2  # 2: batches as fairseq-generate's (reference lengths too)


@dataclass
class DistillConfig:
    teachers: list[str]
    out_dir: str
    spm_model: str
    split: str = "train"
    source: str | None = None  # raw source text (encoded with spm_model), or the source text of --data
    data_dir: str | None = None  # fairseq-binarized folder holding SPLIT.SRC-TGT.SRC.{bin,idx}
    reference: str | None = None  # raw reference targets, line-aligned with the source
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


@dataclass
class DistillResult:
    out_dir: Path
    complete: bool  # False: this shard is done but others are not; merge later
    meta: dict | None = None


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _device(cfg: DistillConfig) -> str:
    import torch

    if cfg.device == "auto":
        if torch.cuda.is_available():
            return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        return "cpu"
    return cfg.device


def _parallelism(cfg: DistillConfig, device: str) -> tuple[int, int]:
    if device != "cpu":
        return 1, cfg.threads or 1
    # under torchrun, the ranks on this machine share its cores
    cores = max(1, available_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    workers = cfg.workers or cores
    return workers, cfg.threads or max(1, cores // workers)


class _Session:
    """Everything loaded once per process: teacher, sentencepiece, corpus, fairseq dataset, chunk plan."""

    def __init__(self, cfg: DistillConfig, device: str = "cpu"):
        from .distill_corpus import load_corpus, load_sentencepiece
        from .teacher import check_same_dictionary, load_teacher

        self.cfg, self.device = cfg, device
        self.strategy = build_strategy(cfg.decoding)
        if self.strategy.needs_reference and not cfg.reference:
            raise ValueError(f"strategy {self.strategy.name} reranks against the reference: pass --reference")
        self.teacher = load_teacher(cfg.teachers, cfg.dict_dir)
        if cfg.data_dir:
            check_same_dictionary(self.teacher, Path(cfg.data_dir))
        self.sp = load_sentencepiece(cfg.spm_model)
        self.corpus = load_corpus(teacher=self.teacher, sp=self.sp, split=cfg.split, source=cfg.source,
                                  data_dir=cfg.data_dir, reference=cfg.reference)
        self.dataset = self._dataset()
        if device != "cpu":
            for model in self.teacher.models:
                model.to(device)

    def _dataset(self):
        """The corpus as the LanguagePairDataset fairseq-generate builds for a binarized split (the translation
        task's load_dataset): same padding, same target sizes, ties shuffled in every split but "test".

        A sentence's hypothesis depends, in its last float bits, on the batch it is decoded in (padding
        changes the order of the sums), so fairseq-generate's hypotheses are only reproduced exactly from
        fairseq-generate's batches: length-sorted by source then reference, counted as max(source, reference)
        tokens. Without references, batches follow the source alone."""
        from fairseq.data import LanguagePairDataset

        task, corpus = self.teacher.task, self.corpus

        def setting(name, default):
            try:
                return getattr(task.cfg, name, default)
            except Exception:  # an interpolation into the training config that does not resolve here
                return default

        return LanguagePairDataset(
            corpus.source_tokens, np.array([len(t) for t in corpus.source_tokens]), task.source_dictionary,
            tgt=None, tgt_sizes=corpus.reference_sizes, tgt_dict=task.target_dictionary,
            left_pad_source=setting("left_pad_source", True), left_pad_target=setting("left_pad_target", False),
            shuffle=self.cfg.split != "test", num_buckets=setting("num_batch_buckets", 0),
            pad_to_multiple=setting("required_seq_len_multiple", 1))

    def batches(self) -> list[list[int]]:
        """fairseq-generate's own batching (length-sorted, by tokens, its seed), with every sentence kept:
        batch multiple 1, and no size filter (over-long sources were truncated beforehand)."""
        sizes = self.dataset.num_tokens_vec(np.arange(len(self.corpus)))
        longest = int(sizes.argmax())
        if self.cfg.max_tokens is not None and sizes[longest] > self.cfg.max_tokens:
            raise ValueError(f"--max-tokens {self.cfg.max_tokens} is smaller than the longest sentence (line "
                             f"{longest + 1}: {sizes[longest]} tokens in the source or the reference); raise "
                             f"--max-tokens to at least {sizes[longest]}")
        iterator = self.teacher.task.get_batch_iterator(
            dataset=self.dataset, max_tokens=self.cfg.max_tokens, max_sentences=self.cfg.max_sentences,
            max_positions=None, ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1,
            num_shards=1, shard_id=0, num_workers=0, disable_iterator_cache=True)
        return [list(map(int, batch)) for batch in iterator.frozen_batches]

    def fingerprint(self) -> dict:
        if not hasattr(self, "_fingerprint"):
            self._fingerprint = self._compute_fingerprint()
        return self._fingerprint

    def _compute_fingerprint(self) -> dict:
        cfg = self.cfg
        return {"progress_version": PROGRESS_VERSION,
                "teachers": [_sha256_file(p) for p in cfg.teachers],
                "corpus": self.corpus.fingerprint(), "decoding": asdict(cfg.decoding),
                "max_tokens": cfg.max_tokens, "max_sentences": cfg.max_sentences,
                "chunk_sentences": cfg.chunk_sentences, "split": cfg.split,
                "spm_model": _sha256_file(cfg.spm_model)}

    def decoder(self):
        from .decoding.runner import ChunkDecoder

        return ChunkDecoder(self.teacher, self.strategy, self.dataset, self.sp, self.corpus.references, self.device)


def _reuse_freed_memory() -> None:
    """Serve big tensors from the heap and keep freed memory for reuse (glibc only).

    A beam step's scores are B*beam x V floats (about 40 MB at 3000 tokens, vocabulary 8k): above glibc's
    largest mmap threshold, so every step maps fresh pages that the kernel must zero, and two decoding
    processes then compete for memory bandwidth. With mmap off and no trimming, each step reuses the last
    step's pages; a worker keeps its peak memory until it exits. Measured: about 5% less decoding CPU time.
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


# ---- worker processes (spawned: each loads its own teacher; nothing forked from a threaded parent) ----
_WORKER = {}


def _worker_init(cfg: DistillConfig, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    _reuse_freed_memory()
    logging.disable(logging.WARNING)  # fairseq's loading chatter, once per worker
    _WORKER["decoder"] = _Session(cfg).decoder()


def _worker_decode(job):
    index, batches = job
    return index, _WORKER["decoder"].decode_chunk(batches)


def _decode_pending(session: _Session, store: ChunkStore, chunks, pending: list[int], workers: int,
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
            _reuse_freed_memory()
            decoder = session.decoder()
            for index, batches in jobs:
                result = decoder.decode_chunk(batches)
                store.save(index, result)
                bar.update(len(result["ids"]))
        else:
            context = multiprocessing.get_context("spawn")
            with context.Pool(min(workers, len(jobs)), initializer=_worker_init,
                              initargs=(session.cfg, threads)) as pool:
                # longest chunks first (chunks are sorted by length), so no worker is left alone at the end
                for index, result in pool.imap_unordered(_worker_decode, jobs[::-1]):
                    store.save(index, result)
                    bar.update(len(result["ids"]))
    finally:
        bar.close()
    return total


def _merge(session: _Session, store: ChunkStore, chunks, num_shards: int, timing: dict, started: float) -> dict:
    from .distill_corpus import token_strings
    from .distill_output import write_output
    from .distill_scores import scores

    cfg, corpus, teacher = session.cfg, session.corpus, session.teacher
    store.check_complete(len(chunks), num_shards)
    out_dir = Path(cfg.out_dir)
    for stale in out_dir.parent.glob(f".{out_dir.name}.*.tmp"):  # left by a merge killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    pieces: list[str | None] = [None] * len(corpus)
    target_text: list[str | None] = [None] * len(corpus)
    statistics, decode_seconds = [], 0.0
    for index in range(len(chunks)):
        result = store.load(index)
        decode_seconds += result["seconds"]
        if "statistics" in result:
            statistics.append(result["statistics"])
        for sentence_id, piece_line, text in zip(result["ids"], result["pieces"], result["text"]):
            pieces[sentence_id], target_text[sentence_id] = piece_line, text
    lost = [i + 1 for i, p in enumerate(pieces) if p is None]
    if lost:
        raise ProgressError(f"{len(lost)} sentences have no output (lines {lost[:10]}...); delete {store.dir} "
                            "and rerun")
    source_pieces = token_strings(teacher.src_dict, corpus.source_tokens)
    meta = {
        "name": cfg.name or out_dir.name, "strategy": session.strategy.name,
        "settings": session.strategy.describe(), "all_settings": asdict(cfg.decoding),
        "seed": cfg.decoding.seed, "teacher": teacher.describe(), "corpus": corpus.source_description,
        "split": cfg.split, "source_lang": teacher.source_lang, "target_lang": teacher.target_lang,
        "sentences": len(corpus), "empty_source_lines": corpus.empty_lines,
        "truncated_source_lines": corpus.truncated_lines, "max_source_positions": teacher.max_positions[0],
        "empty_outputs": sum(1 for p in pieces if not p),
        "scores": scores(statistics, target_text, corpus.references),
        "batching": {"max_tokens": cfg.max_tokens, "max_sentences": cfg.max_sentences,
                     "chunk_sentences": cfg.chunk_sentences, "chunks": len(chunks),
                     "required_batch_size_multiple": 1, "num_shards": num_shards},
        "fingerprint": session.fingerprint(), "nat_kd_version": __version__,
        "timing": {**timing, "chunk_decode_seconds_total": round(decode_seconds, 3)},
        "files": {"source": f"{cfg.split}.{teacher.source_lang}", "target": f"{cfg.split}.{teacher.target_lang}",
                  "binarized": "bin/", "pieces": "spm/"},
    }
    write_output(out_dir, split=cfg.split, src=teacher.source_lang, tgt=teacher.target_lang,
                 source_text=corpus.source_text, source_tokens=corpus.source_tokens,
                 source_pieces=source_pieces, target_pieces=pieces,
                 target_text=target_text, dict_dir=teacher.dict_dir, meta=meta,
                 data_dir=Path(cfg.data_dir) if cfg.data_dir else None)
    # the run's whole wall time, merge included (the output folder is complete already; this only updates it)
    meta["timing"]["wall_seconds"] = round(time.perf_counter() - started, 3)
    atomic.write_json(out_dir / "meta.json", meta)
    return meta


def _already_done(out_dir: Path, fingerprint: dict) -> dict | None:
    meta_file = out_dir / "meta.json"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if meta.get("fingerprint") == fingerprint:
            return meta
    return None


def distill(cfg: DistillConfig) -> DistillResult:
    started = time.perf_counter()
    device = _device(cfg)
    workers, threads = _parallelism(cfg, device)
    num_shards, shard_id = shard_from_env(cfg.num_shards, cfg.shard_id)
    session = _Session(cfg, device)
    out_dir = Path(cfg.out_dir)
    fingerprint = session.fingerprint()
    done = _already_done(out_dir, fingerprint)
    if done is not None:
        logger.info("%s is already complete (same teacher, corpus and settings): nothing to do", out_dir)
        return DistillResult(out_dir, True, done)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "meta.json").is_file():
        raise ValueError(f"{out_dir} exists and is not a distilled corpus (no meta.json); it would be replaced: "
                         "choose another --out or delete it")
    store = ChunkStore(out_dir.with_name(out_dir.name + ".partial"))
    chunks = store.open_plan(fingerprint, plan_chunks(session.batches(), cfg.chunk_sentences))
    label = f"shard {shard_id}/{num_shards}" if num_shards > 1 else cfg.split
    decoded, decode_wall = 0, 0.0
    if not cfg.merge_only:
        pending = [i for i in shard_chunks(len(chunks), shard_id, num_shards) if not store.is_done(i)]
        logger.info("%s: %d chunks, %d to decode in %s (%d worker(s) x %d thread(s) on %s)", out_dir,
                    len(chunks), len(pending), label, workers, threads, device)
        t0 = time.perf_counter()
        decoded = _decode_pending(session, store, chunks, pending, workers, threads, label)
        decode_wall = time.perf_counter() - t0
    if store.missing(len(chunks)) and not cfg.merge_only:
        logger.info("%s done; other shards are still missing. When all are done, run the same command with "
                    "--merge (or any shard finishing last merges)", label)
        return DistillResult(out_dir, False)
    with store.merge_lock() as mine:
        if not mine:
            logger.info("another process is merging %s", out_dir)
            return DistillResult(out_dir, False)
        done = _already_done(out_dir, fingerprint)
        if done is None:
            timing = {"wall_seconds": None, "decode_wall_seconds": round(decode_wall, 3),
                      "sentences_decoded_this_run": decoded,
                      "sentences_per_second": round(decoded / decode_wall, 2) if decode_wall > 0 else None,
                      "workers": workers, "threads_per_worker": threads, "device": device}
            done = _merge(session, store, chunks, num_shards, timing, started)
    store.remove()
    return DistillResult(out_dir, True, done)
