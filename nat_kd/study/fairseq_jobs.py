"""The study's model jobs, as the command lines a user would type: fairseq-train, fairseq-generate and
nat_kd.generate_distilled, each in its own process (one torch thread), its output appended to the step's log.

Every command passes --required-batch-size-multiple 1 (fairseq's default of 8 drops the longest sentences).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import sacrebleu

from fairseq_plugins.models.nat import STUDENT_FAMILIES
from nat_kd.artifacts import DistilledSet
from nat_kd.tokenization import TokenizationSettings

from .config import ModelShape, Training

ROOT = Path(__file__).resolve().parents[2]


def run_logged(cmd: list, log: Path, threads: int, stdout: Path | None = None) -> None:
    """Run ``cmd``, appending its output to ``log`` (with the command line first), or only its stderr when
    ``stdout`` names a file for the rest; raise on failure with the log's last lines."""
    cmd = [str(c) for c in cmd]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("$ " + " ".join(cmd) + "\n")
        handle.flush()
        out = open(stdout, "w", encoding="utf-8") if stdout else handle
        try:
            code = subprocess.call(cmd, cwd=ROOT, env=env, stdout=out,
                                   stderr=handle if stdout else subprocess.STDOUT)
        finally:
            if stdout:
                out.close()
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RuntimeError(f"exit status {code}: {' '.join(cmd[:4])} ...\n    " + "\n    ".join(tail))


def _tool(name: str) -> list[str]:
    return [sys.executable, "-m", f"fairseq_cli.{name}"]


def train(bin_dir: Path, save_dir: Path, *, arch: str, shape: ModelShape, training: Training, log: Path,
          threads: int, nat_family: str | None = None, seed: int = 1) -> Path:
    """fairseq-train an AT (``nat_family`` None) or a NAT student; returns checkpoint_best.pt (lowest
    validation loss: the study selects on the validation set)."""
    if nat_family:
        task = ["--task", "translation_lev", "--criterion", "nat_loss", *STUDENT_FAMILIES[nat_family].train_flags]
    else:
        task = ["--task", "translation", "--criterion", "label_smoothed_cross_entropy"]
    validate = ["--validate-interval-updates", training.validate_every] if training.validate_every else []
    run_logged([*_tool("train"), bin_dir, "--user-dir", ROOT / "fairseq_plugins", *task, "--arch", arch,
                *shape.flags(), "--label-smoothing", training.label_smoothing,
                "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", training.lr,
                "--lr-scheduler", "inverse_sqrt", "--warmup-updates", training.warmup, "--warmup-init-lr", "1e-07",
                "--weight-decay", training.weight_decay,
                "--max-tokens", training.max_tokens, "--required-batch-size-multiple", 1,
                "--max-update", training.updates, *validate, "--save-dir", save_dir, "--no-epoch-checkpoints",
                "--seed", seed,
                "--log-format", "simple", "--log-interval", 50, "--no-progress-bar", "--num-workers", 0],
               log, threads)
    best = save_dir / "checkpoint_best.pt"
    if not best.is_file():
        raise RuntimeError(f"fairseq-train wrote no {best}")
    return best


def translate(bin_dir: Path, checkpoint: Path, split: str, out: Path, *, beam: int, max_tokens: int, log: Path,
              threads: int, tokenization: TokenizationSettings, languages: tuple[str, str],
              nat_family: str | None = None,
              max_len_a: float = 0.0, max_len_b: int = 200) -> list[str]:
    """fairseq-generate ``split``; writes the hypotheses (in corpus order), detokenized by ``tokenization`` as
    the corpus was tokenized, to ``out``."""
    if nat_family:
        task = ["--task", "translation_lev", *STUDENT_FAMILIES[nat_family].decode_flags, "--beam", 1]
    else:
        task = ["--task", "translation", "--beam", beam, "--max-len-a", max_len_a, "--max-len-b", max_len_b]
    raw = out.with_suffix(".generate.txt")
    run_logged([*_tool("generate"), bin_dir, "--user-dir", ROOT / "fairseq_plugins", *task, "--gen-subset", split,
                "--path", checkpoint, "--max-tokens", max_tokens, "--required-batch-size-multiple", 1,
                *tokenization.fairseq_flags(*languages)], log, threads, stdout=raw)
    hyps = {int(m.group(1)): m.group(2) for m in
            re.finditer(r"^D-(\d+)\t[^\t]*\t(.*)$", raw.read_text(encoding="utf-8"), re.M)}
    count = len(hyps)
    if sorted(hyps) != list(range(count)):
        raise RuntimeError(f"{raw}: hypothesis ids are not 0..{count - 1}")
    lines = [hyps[i] for i in range(count)]
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    raw.unlink()
    return lines


def bleu(hypotheses: list[str], references: list[str]) -> dict:
    """sacrebleu corpus BLEU on detokenized text, with its signature."""
    if len(hypotheses) != len(references):
        raise RuntimeError(f"{len(hypotheses)} hypotheses for {len(references)} references: a sentence was lost")
    metric = sacrebleu.BLEU()
    return {"bleu": round(metric.corpus_score(hypotheses, [references]).score, 2),
            "signature": str(metric.get_signature())}


def distil(prepared: Path, teacher: Path, out: Path, *, strategy: str, decoding: dict, max_tokens: int,
           log: Path, threads: int) -> dict:
    """nat_kd.generate_distilled over the training split; returns its meta.json."""
    flags = []
    for key, value in decoding.items():
        flags += [f"--{key.replace('_', '-')}", value]
    run_logged([sys.executable, "-m", "nat_kd.generate_distilled", "--teacher-path", teacher, "--prepared", prepared,
                "--split", "train", "--strategy", strategy, *flags, "--max-tokens", max_tokens,
                "--workers", 1, "--threads", threads, "--out", out, "--no-progress-bar"], log, threads)
    return DistilledSet(out).meta()
