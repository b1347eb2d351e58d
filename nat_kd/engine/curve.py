"""Training with a validation-BLEU learning curve: fairseq-train in chunks of ``bleu_every`` updates, the
validation set decoded after each chunk, the checkpoint with the best validation BLEU kept, and an early stop
once ``patience`` measurements in a row bring no new best.

Why chunks and not fairseq's ``--eval-bleu --patience``: the NAT students' task (translation_lev) scores
validation by loss only, and one mechanism serves teachers and students alike, with the very BLEU the study
reports (sacrebleu on detokenized output against the raw references). fairseq-train resumes each chunk from
checkpoint_last.pt with its optimizer, learning-rate schedule and place in the data, and seeds every update
by its number; it groups the sentences into batches anew when a chunk starts in a later epoch, so a chunked
run is another draw than one uninterrupted run, not its path (docs/study.md, "Learning curves"). curve.json
is rewritten after every measurement: a killed run resumes in the chunk it was in.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from nat_kd import atomic

from .training import Training

BEST = "checkpoint_bleu_best.pt"


def checkpoint_updates(path: Path) -> int:
    """How many updates a fairseq checkpoint has done."""
    import torch

    import fairseq_plugins.checkpoint_safety  # noqa: F401  (puts fairseq's Namespace on torch's allow-list)

    return int(torch.load(path, map_location="cpu", mmap=True)["optimizer_history"][-1]["num_updates"])


def chunk_ends(training: Training) -> list[int]:
    """The update counts after which validation BLEU is measured: every ``bleu_every``, and the last one."""
    return sorted(set(range(training.bleu_every, training.updates, training.bleu_every)) | {training.updates})


def best_point(curve: list[dict]) -> dict | None:
    """The first measurement with the highest BLEU (an equal score later is no improvement)."""
    return max(curve, key=lambda p: p["valid_bleu"], default=None) if curve else None


def bleu_at(curve: list[dict], updates: int) -> float | None:
    """The validation BLEU measured after ``updates`` updates (None: not measured there)."""
    return next((p["valid_bleu"] for p in curve if p["updates"] == updates), None)


def out_of_patience(curve: list[dict], patience: int) -> bool:
    best = best_point(curve)
    return bool(patience and best is not None and len(curve) - 1 - curve.index(best) >= patience)


def _copy_atomically(src: Path, dst: Path) -> None:
    with atomic.replacing(dst) as tmp:
        shutil.copyfile(src, tmp)


def train_with_curve(save_dir: Path, training: Training, train: Callable[[Training], Path],
                     valid_bleu: Callable[[Path, Path], dict]) -> dict:
    """Train to ``training.updates`` in chunks; ``train(training)`` runs fairseq-train up to
    ``training.updates`` (resuming from checkpoint_last.pt), ``valid_bleu(checkpoint, hypotheses_file)``
    decodes the validation set and returns ``jobs.bleu``'s dict. Returns the best checkpoint, the curve and
    where it stopped; the best checkpoint's validation hypotheses are in ``save_dir/valid.best.hyp``."""
    save_dir.mkdir(parents=True, exist_ok=True)
    curve_path, last, best_hyps = save_dir / "curve.json", save_dir / "checkpoint_last.pt", save_dir / "valid.best.hyp"
    # a chunk's training time, kept until its measurement: a run killed in between resumes with it
    chunk_path = save_dir / "chunk_trained.json"
    curve = json.loads(curve_path.read_text(encoding="utf-8")) if curve_path.is_file() else []
    for end in chunk_ends(training):
        if out_of_patience(curve, training.patience):
            break
        if any(p["updates"] == end for p in curve):
            continue  # measured before the run was killed
        done = checkpoint_updates(last) if last.is_file() else 0
        if done > end:
            raise RuntimeError(f"{last} has {done} updates, past the next measurement at {end}; delete "
                               f"{save_dir} to train this model again")
        if done < end:  # fairseq-train would take one more update even at its budget
            started = time.perf_counter()
            train(replace(training, updates=end))
            atomic.write_json(chunk_path, {"updates": end, "train_seconds": round(time.perf_counter() - started, 1)})
        chunk = json.loads(chunk_path.read_text(encoding="utf-8")) if chunk_path.is_file() else {}
        trained = chunk["train_seconds"] if chunk.get("updates") == end else 0.0
        score = valid_bleu(last, save_dir / "valid.last.hyp")
        best = best_point(curve)
        # copied before the curve names it the best, so a kill in between only repeats the copy
        if best is None or score["bleu"] > best["valid_bleu"]:
            _copy_atomically(last, save_dir / BEST)
            _copy_atomically(save_dir / "valid.last.hyp", best_hyps)
        curve.append({"updates": end, "valid_bleu": score["bleu"], "train_seconds": trained,
                      "finished": time.strftime("%Y-%m-%d %H:%M:%S")})
        atomic.write_json(curve_path, curve)
    best = best_point(curve)
    return {"checkpoint": str(save_dir / BEST), "curve": curve, "best_updates": best["updates"],
            "valid_bleu": best["valid_bleu"],
            "valid_hypotheses": str(best_hyps), "updates_trained": curve[-1]["updates"],
            "stopped_early": curve[-1]["updates"] < training.updates}


def progress_note(work: Path) -> str:
    """Where the learning curves in a begun step's work folder stand ('' if it has none), for --list and the
    results rendered mid-run."""
    notes = []
    for path in sorted(work.rglob("curve.json")):
        curve = json.loads(path.read_text(encoding="utf-8"))
        if best := best_point(curve):
            updates = curve[-1]["updates"]
            notes.append(f"measured to {updates:,} update{'s' * (updates != 1)}, best validation BLEU "
                         f"{best['valid_bleu']:.2f} at {best['updates']:,}")
    return "; ".join(notes)
