"""The study's model jobs, as the command lines a user would type: fairseq-train, fairseq-generate and
nat_kd.generate_distilled, each in its own process (one torch thread), its output appended to the step's log.

Every command passes --required-batch-size-multiple 1 (fairseq's default of 8 drops the longest sentences).

Each job is a child forked from a server that imported fairseq, the plugins and the generator once
(multiprocessing's forkserver). A fresh interpreter spends seconds importing fairseq, more than a micro
model's whole job; the server itself never computes, so forking it is safe for torch's thread pools.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import runpy
import shutil
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import sacrebleu

from fairseq_plugins.models.nat import STUDENT_FAMILIES
from nat_kd import atomic
from nat_kd.artifacts import DistilledSet
from nat_kd.tokenization import TokenizationSettings

from fairseq_plugins.models.sizes import ModelSize

from .devices import CPU, visible_devices
from .training import Training

ROOT = Path(__file__).resolve().parents[2]
JOB_MODULES = ("fairseq_cli.train", "fairseq_cli.generate", "nat_kd.generate_distilled")  # the study's jobs
NO_EPOCH_SAVES = 10 ** 9  # a --save-interval in epochs that no training reaches
_forkserver = multiprocessing.get_context("forkserver")
_forkserver.set_forkserver_preload(["nat_kd.engine.job_server"])  # it imports what the jobs need, in its order


def _end_with_the_driver(driver) -> None:
    """In the forked child: end the job (SIGTERM) when ``driver``, a connection only the driver writes to and
    never does, reaches its end: the driver ended, however it ended (a kill of its pid, -9 included). The job
    server cannot tell: every job holds it open. A job outliving its driver would train beside the rerun that
    resumes the same step, both writing its checkpoints."""
    import signal
    import threading

    def watch():
        try:
            driver.recv()
        except EOFError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="driver-watch", daemon=True).start()


def _run_module(module: str, args: list[str], log: str, stdout: str | None, threads: int, cwd: str, done,
                driver, gpus: str | None) -> None:
    """In the forked child: ``python -m module args`` in ``cwd`` with its streams on the step's files; sends True on
    ``done`` when the module ran to its end, and ends when ``driver`` does (``_end_with_the_driver``). ``gpus``:
    its CUDA_VISIBLE_DEVICES (None: the driver's), read by CUDA when the job first uses it."""
    import torch

    # A child of the forkserver inherits its start method, so a DataLoader worker (fairseq-generate's default
    # --num-workers 1) would start a second forkserver and import fairseq again: seconds per evaluation. Forked
    # from the job, as from the command typed in a shell, it starts at once.
    multiprocessing.set_start_method("fork", force=True)
    _end_with_the_driver(driver)
    os.chdir(cwd)
    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    torch.set_num_threads(threads)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "a", encoding="utf-8") as err:
        os.dup2(err.fileno(), 2)
    if stdout is None:
        os.dup2(2, 1)
    else:
        with open(stdout, "w", encoding="utf-8") as out:
            os.dup2(out.fileno(), 1)
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
    done.send(True)


def device_flags(module: str, device: str | None) -> list[str]:
    """The options that put a job of ``module`` on ``device`` ("cpu" or "cuda:N"; None: none, the job picks a
    GPU where it sees one); which GPU, its CUDA_VISIBLE_DEVICES says (devices.visible_devices)."""
    if device is None:
        return []
    if module == "nat_kd.generate_distilled":
        return ["--device", CPU if device == CPU else "cuda"]
    return ["--cpu"] if device == CPU else []  # fairseq-train and fairseq-generate: a GPU unless --cpu


def run_logged(module: str, args: list, log: Path, threads: int, stdout: Path | None = None,
               cwd: Path = ROOT, device: str | None = None) -> None:
    """``python -m module args`` in ``cwd``, appending its output to ``log`` (with the command line first), or
    only its stderr when ``stdout`` names a file for the rest; raise on failure with the log's last lines.
    ``device``: "cpu" or "cuda:N" (device_flags), None: as the module picks."""
    args = [str(a) for a in [*args, *device_flags(module, device)]]
    gpus = visible_devices(device)
    with open(log, "a", encoding="utf-8") as handle:
        if gpus is not None:  # a line of its own: the command line below stays the one a user types
            handle.write(f"# {device}: CUDA_VISIBLE_DEVICES={gpus}\n")
        handle.write("$ " + " ".join(["python", "-m", module, *args]) + "\n")
    # The child says itself that it finished: under load, Python's forkserver can lose a child's exit status
    # and report 255 for a job that succeeded (python/cpython#140867), seen here with two jobs at once.
    receive, send = _forkserver.Pipe(duplex=False)
    driver_read, driver_write = _forkserver.Pipe(duplex=False)  # written to by no one: open while we live
    job = _forkserver.Process(target=_run_module,
                              args=(module, args, str(log), stdout and str(stdout), threads, str(cwd), send,
                                    driver_read, gpus))
    job.start()
    send.close()
    driver_read.close()
    job.join()
    driver_write.close()
    try:
        finished = receive.recv()
    except EOFError:  # the child ended without saying so
        finished = False
    receive.close()
    if not finished:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RuntimeError(f"exit status {job.exitcode}: python -m {module} {' '.join(args[:2])} ...\n    "
                           + "\n    ".join(tail))


def train_args(bin_dir: Path, save_dir: Path, *, arch: str, shape: ModelSize | None, training: Training,
               nat_family: str | None, seed: int = 1, gpus: int = 0, fp16: bool = False, save_updates: int = 0,
               log_interval: int = 50, references: dict | None = None, selective_kd: dict | None = None) -> list:
    """fairseq-train's arguments for an AT teacher (``nat_family`` None) or a NAT student of the study;
    ``shape`` None keeps the architecture's own sizes. ``references``: a set of several references a sentence
    (nat_kd.references), which the student's loss takes (StudentFamily.references), with these settings of
    multi_reference_nat_loss (``references``, ``reference_selection``, DDRS's schedule); ``selective_kd``: a
    Selective KD set (nat_kd.selective_kd), with these settings of selective_kd_translation_lev (the threshold's)."""
    # save_updates: a checkpoint_last.pt every N updates too (a requeued cluster job resumes from it); of the
    # checkpoints fairseq then also names by their update, only the latest is kept
    saves = ["--save-interval-updates", save_updates, "--keep-interval-updates", 1] if save_updates else []
    if training.bleu_every:  # a learning curve's chunk (curve.py): fairseq's --save-interval counts epochs, and
        saves += ["--save-interval", NO_EPOCH_SAVES]  # a run that never reaches it saves at its own end only
    training = training.used_by(nat_family)
    if nat_family:
        family = STUDENT_FAMILIES[nat_family]
        if references:
            selection = references["reference_selection"]
            if not family.references:
                raise ValueError(f"{nat_family} students take one reference a sentence, not a set of "
                                 f"{references['references']}")
            if selection not in family.references:
                raise ValueError(f"{nat_family} students take --reference-selection {' or '.join(family.references)}, "
                                 f"not {selection}")
            task = ["--task", "kd_translation_lev", "--criterion", "multi_reference_nat_loss", *_flags(references)]
        elif selective_kd:
            task = ["--task", "selective_kd_translation_lev", "--criterion", "nat_loss", *_flags(selective_kd)]
        else:
            task = ["--task", family.task, "--criterion", "nat_loss"]
        task += family.train_flags
        if training.glance_anneal_updates:
            task += ["--glance-anneal-updates", training.glance_anneal_updates]
    else:
        task = ["--task", "translation", "--criterion", "label_smoothed_cross_entropy"]
    validate = ["--validate-interval-updates", training.validate_every] if training.validate_every else []
    distributed = ["--distributed-world-size", gpus] if gpus > 1 else []
    return [bin_dir, "--user-dir", ROOT / "fairseq_plugins", *task, "--arch", arch,
            *(shape.flags() if shape else []), "--label-smoothing", training.label_smoothing,
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", training.lr,
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", training.warmup, "--warmup-init-lr", "1e-07",
            "--weight-decay", training.weight_decay,
            "--max-tokens", training.max_tokens, "--required-batch-size-multiple", 1,
            "--max-update", training.updates, *validate, "--save-dir", save_dir, "--no-epoch-checkpoints", *saves,
            "--seed", seed, *distributed, *(["--fp16"] if fp16 else []),
            "--log-format", "simple", "--log-interval", log_interval, "--no-progress-bar", "--num-workers", 0]


def _flags(settings: dict) -> list:
    """fairseq options from their dataclass field names: ``{"kd_threshold": 0.4}`` is ``--kd-threshold 0.4``."""
    return [item for key, value in settings.items() for item in (f"--{key.replace('_', '-')}", value)]


_UPDATES = re.compile(r"\bnum_updates[=\s]+(\d+)")
_TRAIN_COMMAND = "$ python -m fairseq_cli.train "
REPEATED = "repeated_updates.json"  # in the save folder: the updates trained again after a kill or requeue


def count_repeated_updates(save_dir: Path, log: Path) -> int:
    """Before fairseq-train resumes in ``save_dir``: the updates its last run in ``log`` reached beyond the
    checkpoint it resumes from (those are trained again), added to REPEATED, and the update it resumes from
    (``resumed_from``); returns the total repeated so far."""
    from .curve import checkpoint_updates

    path, last = save_dir / REPEATED, save_dir / "checkpoint_last.pt"
    counted = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"updates": 0, "run": None}
    if not save_dir.is_dir() or not log.is_file():
        return counted["updates"]  # never begun in this work folder
    text = log.read_text(encoding="utf-8", errors="replace")
    start = text.rfind(_TRAIN_COMMAND)  # the last run: where its command line is in the log
    if start < 0 or start == counted["run"]:
        return counted["updates"]
    reached = max((int(n) for n in _UPDATES.findall(text[start:])), default=0)
    saved = checkpoint_updates(last) if last.is_file() else 0
    repeated = max(0, reached - saved)  # a run cut short before its first log line beyond the checkpoint: 0
    total = counted["updates"] + repeated
    # a run cut short (killed, preempted: fairseq never said it was done) is resumed from the checkpoint here
    cut = "done training in" not in text[start:]
    resumed = counted.get("resumed_from", []) + ([saved] if cut else [])
    atomic.write_json(path, {"updates": total, "run": start, **({"resumed_from": resumed} if resumed else {})})
    if cut:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"# resuming from update {saved}: the last run was cut short " + (
                f"at update {reached}, so {repeated} updates are trained again\n" if repeated else
                "before it logged an update beyond it\n"))
    return total


def repair_last_checkpoint(save_dir: Path, log: Path) -> None:
    """Before fairseq-train resumes in ``save_dir``: a checkpoint_last.pt that a kill cut short is replaced by
    the readable checkpoint of the most updates there. fairseq writes a save's first checkpoint atomically but
    copies it to its other names (checkpoint_last.pt among them) in place, so a job preempted during the copy
    leaves a truncated checkpoint_last.pt, from which fairseq could not resume; the file it was copied from
    holds the same state."""
    from .curve import BEST, checkpoint_updates

    last = save_dir / "checkpoint_last.pt"
    if not last.is_file():
        return
    try:
        checkpoint_updates(last)
        return
    except Exception:  # noqa: BLE001 - torch's error for a truncated file depends on where it was cut
        pass
    readable = []
    for candidate in save_dir.glob("checkpoint*.pt"):
        if candidate.name in (last.name, BEST) or ".tmp" in candidate.name:
            continue
        try:
            readable.append((checkpoint_updates(candidate), candidate))
        except Exception:  # noqa: BLE001 - cut short too
            continue
    with open(log, "a", encoding="utf-8") as handle:
        if readable:
            updates, source = max(readable)
            with atomic.replacing(last) as tmp:
                shutil.copyfile(source, tmp)
            handle.write(f"# {last.name} was cut short (a kill while fairseq copied it): replaced by {source.name}, "
                         f"update {updates}\n")
        else:
            last.unlink()
            handle.write(f"# {last.name} was cut short and no other checkpoint is readable: training starts over\n")


def resumed_from(save_dir: Path) -> list[int]:
    """The updates a training in ``save_dir`` resumed from after a run was killed or requeued (count_repeated_updates)."""
    path = save_dir / REPEATED
    return json.loads(path.read_text(encoding="utf-8")).get("resumed_from", []) if path.is_file() else []


def train(bin_dir: Path, save_dir: Path, *, arch: str, shape: ModelSize | None, training: Training, log: Path,
          threads: int, nat_family: str | None = None, seed: int = 1, gpus: int = 0, fp16: bool = False,
          save_updates: int = 0, references: dict | None = None, selective_kd: dict | None = None,
          device: str | None = None) -> Path:
    """fairseq-train an AT (``nat_family`` None) or a NAT student; returns checkpoint_best.pt (lowest
    validation loss: the study selects on the validation set). ``gpus`` > 1 (a cluster job's GPUs on its one
    node): fairseq's own data-parallel training, one process per GPU, that fairseq-train spawns itself. A run
    that resumes one killed or requeued counts the updates it trains again (``count_repeated_updates``).

    A learning curve's chunk (``training.bleu_every``) writes checkpoint_last.pt at the run's end only (and
    every ``save_updates``), so a run killed midway starts again from where it started and trains the same
    updates on the same batches. Resumed from an epoch's end instead, fairseq would group the sentences into
    batches anew with that epoch's seed (docs/study.md, "Learning curves"): another training."""
    repair_last_checkpoint(save_dir, log)
    count_repeated_updates(save_dir, log)
    run_logged("fairseq_cli.train", train_args(bin_dir, save_dir, arch=arch, shape=shape, training=training,
                                               nat_family=nat_family, seed=seed, gpus=gpus, fp16=fp16,
                                               save_updates=save_updates, references=references,
                                               selective_kd=selective_kd), log, threads, device=device)
    best = save_dir / "checkpoint_best.pt"
    if not best.is_file():
        raise RuntimeError(f"fairseq-train wrote no {best}")
    return best


_UPS = re.compile(r"\btrain_inner\b.*?\bups=([0-9.]+)")


def training_speed(bin_dir: Path, save_dir: Path, *, arch: str, shape: ModelSize, training: Training,
                   nat_family: str, updates: int, interval: int, log: Path, device: str | None = None) -> float:
    """fairseq-train from scratch for ``updates`` updates on one thread, nothing saved or validated: the median
    of the updates/s it reports every ``interval`` updates, its first report (start-up) left out."""
    start = log.stat().st_size if log.is_file() else 0
    run_logged("fairseq_cli.train",
               [*train_args(bin_dir, save_dir, arch=arch, shape=shape,
                            training=replace(training, updates=updates, bleu_every=0), nat_family=nat_family,
                            log_interval=interval), "--no-save", "--disable-validation"],
               log, threads=1, device=device)
    with open(log, encoding="utf-8", errors="replace") as handle:
        handle.seek(start)
        rates = [float(x) for x in _UPS.findall(handle.read())][1:]
    if not rates:
        raise RuntimeError(f"{log}: fairseq-train reported no updates/s after its first {interval} updates")
    return statistics.median(rates)


def translate(bin_dir: Path, checkpoint: Path, split: str, out: Path, *, beam: int, max_tokens: int, log: Path,
              threads: int, tokenization: TokenizationSettings, languages: tuple[str, str],
              nat_family: str | None = None, batch_size: int | None = None,
              max_len_a: float = 0.0, max_len_b: int = 200, fp16: bool = False,
              sentences: int | None = None, device: str | None = None) -> list[str]:
    """fairseq-generate ``split``; writes the hypotheses (in corpus order), detokenized by ``tokenization`` as
    the corpus was tokenized, to ``out``. ``batch_size``: at most that many sentences a batch (fairseq's
    --batch-size), within ``max_tokens``. A sentence fairseq-generate leaves out (a source its model cannot
    take) is an error, or with ``sentences`` (the split's count) an empty line."""
    if nat_family:
        family = STUDENT_FAMILIES[nat_family]
        task = ["--task", family.task, *family.decode_flags, "--beam", 1]
    else:
        task = ["--task", "translation", "--beam", beam, "--max-len-a", max_len_a, "--max-len-b", max_len_b]
    raw = out.with_suffix(".generate.txt")
    run_logged("fairseq_cli.generate", [bin_dir, "--user-dir", ROOT / "fairseq_plugins", *task, "--gen-subset", split,
                "--path", checkpoint, "--max-tokens", max_tokens, "--required-batch-size-multiple", 1,
                *(["--batch-size", batch_size] if batch_size else []), *(["--fp16"] if fp16 else []),
                *tokenization.fairseq_flags(*languages)], log, threads, stdout=raw, device=device)
    hyps = {int(m.group(1)): m.group(2) for m in
            re.finditer(r"^D-(\d+)\t[^\t]*\t(.*)$", raw.read_text(encoding="utf-8"), re.M)}
    count = sentences or len(hyps)
    if sentences is None and sorted(hyps) != list(range(count)):
        raise RuntimeError(f"{raw}: hypothesis ids are not 0..{count - 1}")
    lines = [hyps.get(i, "") for i in range(count)]
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    raw.unlink()
    return lines


# fairseq-generate's closing line; its sentences/s has two decimals where its seconds have one
_SPEED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in [\d.]+s \(([\d.]+) sentences/s")


def generation_speed(log: Path) -> dict:
    """The speed of the last fairseq-generate in ``log``, from its own closing line (the time spent generating,
    loading the model and the data excluded)."""
    found = _SPEED.findall(log.read_text(encoding="utf-8", errors="replace"))
    if not found:
        raise RuntimeError(f"{log}: no fairseq-generate 'Translated N sentences' line")
    sentences, tokens, per_second = found[-1]
    sentences, per_second = int(sentences.replace(",", "")), float(per_second)
    return {"sentences": sentences, "tokens": int(tokens.replace(",", "")), "sentences_per_second": per_second,
            "seconds": round(sentences / per_second, 3)}


def bleu(hypotheses: list[str], references: list[str]) -> dict:
    """sacrebleu corpus BLEU on detokenized text, with its signature."""
    if len(hypotheses) != len(references):
        raise RuntimeError(f"{len(hypotheses)} hypotheses for {len(references)} references: a sentence was lost")
    metric = sacrebleu.BLEU()
    return {"bleu": round(metric.corpus_score(hypotheses, [references]).score, 2),
            "signature": str(metric.get_signature())}


def distil(prepared: Path, teacher: Path, out: Path, *, strategy: str, decoding: dict, max_tokens: int,
           log: Path, threads: int, fp16: bool = False, device: str | None = None) -> dict:
    """nat_kd.generate_distilled over the training split; returns its meta.json."""
    flags = ["--fp16"] if fp16 else []
    for key, value in decoding.items():
        flags += [f"--{key.replace('_', '-')}", value]
    run_logged("nat_kd.generate_distilled", ["--teacher-path", teacher, "--prepared", prepared,
                "--split", "train", "--strategy", strategy, *flags, "--max-tokens", max_tokens,
                "--workers", 1, "--threads", threads, "--out", out, "--no-progress-bar"], log, threads,
               device=device)
    return DistilledSet(out).meta()
