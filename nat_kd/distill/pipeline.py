"""Library API of seq-KD data generation: ``distill(DistillConfig(...)) -> DistillResult``.

Plan: load the teacher(s) and the corpus, batch it as fairseq does (sorted by length, by tokens, nothing
dropped), group batches into chunks, decode the chunks this shard owns (in worker processes, one per core,
each saving its chunk atomically), then -- once every chunk of every shard is there -- merge them into the
output directory. ``python -m nat_kd.distill`` (or ``nat_kd.generate_distilled``) is the command line.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from nat_kd import __version__, atomic
from nat_kd.analysis.metrics.sentence import SentenceScorer, SentenceScores
from nat_kd.artifacts import DistilledSet
from nat_kd.errors import SettingsError

from .agreement import check_against, check_references
from .autobatch import AUTO, CPU_MAX_TOKENS, GPU_MAX_TOKENS, AutoBatching, auto_batching
from .config import DistillConfig
from .output import write_output
from .pool import choose_device, decode_pending, parallelism
from .progress import ChunkStore, ProgressError, plan_chunks, shard_chunks, shard_from_env
from .scores import scores
from .loaded import LoadedRun
from .source import token_strings
from .student_vocabulary import StudentData

logger = logging.getLogger("nat_kd.generate_distilled")


@dataclass
class DistillResult:
    out_dir: Path
    complete: bool  # False: this shard is done but others are not; merge later
    meta: dict | None = None


@dataclass
class SavedChunks:
    """The saved chunks put together in sentence order."""

    pieces: list[str]
    target_text: list[str]
    statistics: list  # each chunk's summed BLEU/chrF statistics (with references)
    decode_seconds: float
    line_scores: dict  # column -> each line's score


def load_chunks(store: ChunkStore, n_chunks: int, sentences: int) -> SavedChunks:
    pieces: list[str | None] = [None] * sentences
    target_text: list[str | None] = [None] * sentences
    statistics, decode_seconds, line_scores = [], 0.0, {}
    for index in range(n_chunks):
        result = store.load(index)
        decode_seconds += result["seconds"]
        if "statistics" in result:
            statistics.append(result["statistics"])
        for sentence_id, piece_line, text in zip(result["ids"], result["pieces"], result["text"]):
            pieces[sentence_id], target_text[sentence_id] = piece_line, text
        for name, values in result["scores"].items():
            line_scores.setdefault(name, np.full(sentences, np.nan))[result["ids"]] = values
    lost = [i + 1 for i, p in enumerate(pieces) if p is None]
    if lost:
        raise ProgressError(f"{len(lost)} sentences have no output (lines {lost[:10]}...); delete {store.dir} "
                            "and rerun")
    return SavedChunks(pieces, target_text, statistics, decode_seconds, line_scores)


def _merge(loaded: LoadedRun, store: ChunkStore, chunks, num_shards: int, timing: dict, started: float,
           agreement: dict) -> dict:
    cfg, corpus, teacher = loaded.cfg, loaded.corpus, loaded.teacher
    max_tokens, max_sentences = loaded.batch_limits()
    store.check_complete(len(chunks), num_shards)
    out_dir = Path(cfg.out_dir)
    atomic.remove_stale_builds(out_dir)  # left by a merge killed mid-write
    saved = load_chunks(store, len(chunks), len(corpus))
    pieces, target_text = saved.pieces, saved.target_text
    source_pieces = token_strings(teacher.src_dict, corpus.source_tokens)
    out = DistilledSet(out_dir)
    bin_left_out = [] if cfg.keep_empty_lines else corpus.empty_lines
    # a backend that carries out no strategy decodes its own way: none of the strategy's settings were used
    strategy = loaded.strategy if loaded.backend_type.strategies else None
    meta = {
        "name": cfg.name or out_dir.name, "strategy": strategy.name if strategy else None,
        "settings": strategy.describe() if strategy else {}, "all_settings": asdict(cfg.decoding),
        "seed": cfg.decoding.seed, "backend": loaded.fingerprint()["backend"],
        "teacher": loaded.describe_teacher(), "corpus": corpus.source_description,
        "split": cfg.split, "source_lang": teacher.source_lang, "target_lang": teacher.target_lang,
        "tokenization": loaded.tokenization.describe(),
        "sentences": len(corpus), "empty_source_lines": corpus.empty_lines,
        "truncated_source_lines": corpus.truncated_lines, "max_source_positions": teacher.max_positions[0],
        "empty_outputs": sum(1 for p in pieces if not p),
        "scores": scores(saved.statistics, target_text, corpus.references),
        "batching": {"max_tokens": max_tokens, "max_sentences": max_sentences,
                     "chunk_sentences": cfg.chunk_sentences, "chunks": len(chunks),
                     "required_batch_size_multiple": 1, "num_shards": num_shards,
                     **({"auto": loaded.auto.record} if loaded.auto else {})},
        **agreement,
        "fingerprint": loaded.fingerprint(), "nat_kd_version": __version__,
        "timing": {**timing, "chunk_decode_seconds_total": round(saved.decode_seconds, 3)},
        "files": {"source": out.text(cfg.split, teacher.source_lang).name,
                  "target": out.text(cfg.split, teacher.target_lang).name,
                  "binarized": f"{out.bin.root.name}/", "pieces": f"{out.pieces_dir.name}/",
                  # empty sources have an empty target in the text files, and no pair in bin/ by default
                  "binarized_sentences": len(corpus) - len(bin_left_out), "binarized_left_out_lines": bin_left_out,
                  "scores": out.scores_file.name, "card": [out.card_markdown.name, out.card_json.name]},
    }
    # bin/ in the teacher's tokens, with the teacher's data's other splits; or in the student's
    student = StudentData(cfg.student_data, teacher.source_lang, teacher.target_lang) if cfg.student_data else None
    bin_arguments = (student.bin_arguments(corpus.source_text, target_text, meta) if student else
                     {"dict_dir": teacher.dict_dir,
                      "data_dir": Path(cfg.data_dir) if cfg.data_dir and not cfg.published_teacher else None})
    write_output(out_dir, split=cfg.split, src=teacher.source_lang, tgt=teacher.target_lang,
                 source_text=corpus.source_text, source_tokens=corpus.source_tokens,
                 source_pieces=source_pieces, target_pieces=pieces, target_text=target_text, meta=meta,
                 bin_left_out=bin_left_out, references=corpus.references,
                 sentence_scores=SentenceScores(saved.line_scores, SentenceScorer().settings), **bin_arguments)
    if student:
        student.warn_unknown(meta)
    # the run's whole wall time, merge included (the output folder is complete already; this only updates it)
    meta["timing"]["wall_seconds"] = round(time.perf_counter() - started, 3)
    atomic.write_json(out.meta_file, meta)
    return meta


def already_done(out: DistilledSet, fingerprint: dict) -> dict | None:
    meta = out.meta()
    return meta if meta is not None and meta.get("fingerprint") == fingerprint else None


def recorded_max_tokens(out_dir: str) -> int | str | None:
    """The --max-tokens of the run whose saved plan (or finished set) is in ``out_dir``, if any."""
    out = DistilledSet(Path(out_dir))
    for record in (out.progress_dir / "plan.json", out.meta_file):
        try:
            return json.loads(record.read_text(encoding="utf-8"))["fingerprint"]["max_tokens"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def with_batch_default(cfg: DistillConfig, on_gpu: bool) -> DistillConfig:
    """``cfg`` with --max-tokens set, where it was left out: the output folder's own run's (its saved plan or
    finished set, so that a rerun on another device finishes the same batches), else the device's default."""
    if cfg.max_tokens is not None:
        return cfg
    recorded = recorded_max_tokens(cfg.out_dir)
    return replace(cfg, max_tokens=recorded or (GPU_MAX_TOKENS if on_gpu else CPU_MAX_TOKENS))


def check_auto_device(cfg: DistillConfig, device: str) -> None:
    if cfg.max_tokens == AUTO and device == "cpu":
        raise SettingsError("--max-tokens auto sizes batches to a GPU's free memory, and this run decodes on the "
                            f"CPU: give --max-tokens a number (default {CPU_MAX_TOKENS}), or add --device cuda")


def load_run(cfg: DistillConfig, device: str, check_backend: bool = True) -> LoadedRun:
    """The teacher and the corpus loaded, and every setting checked that can be before decoding: what each run
    refuses first, and a cluster driver before it submits its jobs (``check_backend`` False: on a machine
    without the jobs' GPU, which the device's and the backend's checks are about)."""
    cfg.check()
    if check_backend and cfg.fp16 and device == "cpu":
        raise SettingsError("--fp16 runs the teacher in half precision on a GPU: add --device cuda")
    if check_backend:
        check_auto_device(cfg, device)
    loaded = LoadedRun(cfg, device)
    if check_backend:
        loaded.backend_type.check(loaded.backend_settings, loaded.teacher)
    check_references(loaded)
    return loaded


def check_set_folder(out: DistilledSet) -> None:
    """Refuse an output folder that holds something other than a distilled set: writing the set replaces it."""
    atomic.check_replaceable(out.root, out.meta_file.name, "a distilled set", "--out")


def planned_auto_batching(loaded: LoadedRun, store: ChunkStore, fingerprint: dict, device: str, workers: int,
                          num_shards: int) -> AutoBatching:
    """--max-tokens auto: the limits saved with this command's plan, so that a rerun decodes the same batches;
    else sized now to the GPU (autobatch.py)."""
    if num_shards > 1:  # torchrun's WORLD_SIZE (DistillConfig.check refuses --num-shards)
        raise SettingsError(f"--max-tokens auto: the {num_shards} shards must share one plan of batches, and each "
                            "would size its own to its GPU: give --max-tokens a number")
    saved = store.saved_batching(fingerprint)
    if saved is not None:
        return AutoBatching(**saved)
    if loaded.cfg.merge_only:
        raise ProgressError(f"--merge: {store.dir} holds no plan of this command: --max-tokens auto plans its "
                            "batches when it decodes; run the command without --merge")
    auto = auto_batching(loaded, device, workers)
    logger.info("--max-tokens auto: batches of up to %d tokens and %d sentences (%.1f GiB free on %s)",
                auto.max_tokens, auto.max_sentences, auto.record["free_bytes"] / 2**30, device)
    return auto


def distill(cfg: DistillConfig) -> DistillResult:
    started = time.perf_counter()
    device = choose_device(cfg)
    cfg = with_batch_default(cfg, device != "cpu")
    # a merge decodes no shard (a cluster's merge job runs on a CPU): the decoding device's checks are the shards'
    loaded = load_run(cfg, device, check_backend=not cfg.merge_only)
    workers, threads = parallelism(cfg, device)
    num_shards, shard_id = shard_from_env(cfg.num_shards, cfg.shard_id)
    out_dir = Path(cfg.out_dir)
    out = DistilledSet(out_dir)
    fingerprint = loaded.fingerprint()
    done = already_done(out, fingerprint)
    if done is not None:
        logger.info("%s is already complete (same teacher, corpus and settings): nothing to do", out_dir)
        return DistillResult(out_dir, True, done)
    check_set_folder(out)
    store = ChunkStore(out.progress_dir)
    if cfg.max_tokens == AUTO:
        loaded.auto = planned_auto_batching(loaded, store, fingerprint, device, workers, num_shards)
    chunks = store.open_plan(fingerprint, plan_chunks(loaded.batches(), cfg.chunk_sentences),
                             batching=loaded.auto and asdict(loaded.auto))
    label = f"shard {shard_id}/{num_shards}" if num_shards > 1 else cfg.split
    decoded, decode_wall = 0, 0.0
    if not cfg.merge_only:
        loaded.backend_type.prepare(loaded.backend_settings, loaded.teacher)
        pending = [i for i in shard_chunks(len(chunks), shard_id, num_shards) if not store.is_done(i)]
        logger.info("%s: %d chunks, %d to decode in %s (%d worker(s) x %d thread(s) on %s)", out_dir,
                    len(chunks), len(pending), label, workers, threads, device)
        t0 = time.perf_counter()
        decoded = decode_pending(loaded, store, chunks, pending, workers, threads, label)
        decode_wall = time.perf_counter() - t0
    if store.missing(len(chunks)) and not cfg.merge_only:
        logger.info("%s done; other shards are still missing. When all are done, run the same command with "
                    "--merge (or any shard finishing last merges)", label)
        return DistillResult(out_dir, False)
    with store.merge_lock() as mine:
        if not mine:
            logger.info("another process is merging %s", out_dir)
            return DistillResult(out_dir, False)
        done = already_done(out, fingerprint)
        if done is None:
            timing = {"wall_seconds": None, "decode_wall_seconds": round(decode_wall, 3),
                      "sentences_decoded_this_run": decoded,
                      "sentences_per_second": round(decoded / decode_wall, 2) if decode_wall > 0 else None,
                      "workers": workers, "threads_per_worker": threads, "device": device}
            agreement = {f"check_against_{reference}": check_against(loaded, reference, count, workers * threads)
                         for reference, count in (("fairseq", cfg.check_against_fairseq),
                                                  ("transformers", cfg.check_against_transformers)) if count}
            done = _merge(loaded, store, chunks, num_shards, timing, started, agreement)
    store.remove()
    return DistillResult(out_dir, True, done)
