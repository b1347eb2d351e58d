"""The generator's shards as one cluster job array (``--launcher slurm --num-shards N``).

Shard k is ``distill`` with ``--shard-id k``, run by a submitit job; the N jobs go out as one array. Each
saves its chunks as it decodes (progress.py), and the shard that finishes last merges, as when the user
starts the shards by hand. Before submitting anything the driver loads the teacher and the corpus and checks
the settings and the output folder as each shard would (a bad input is refused here, once, instead of in
every job). It then waits for the array (at most [launcher] max_jobs shards run at once); a shard killed from
outside its work (preempted, its node failed, its time limit) is resubmitted, up to [launcher] max_retries
times, and resumes from its saved chunks; a shard's own error is reported, never retried, and the other
shards run to their end. Should no shard have merged (all were done before this run), one more job merges,
on a CPU ([resources.merge]); should the set be complete already (a rerun), the driver submits nothing. While
the jobs run their ids are in ``OUT.jobs/shard-K.submitted.json``, so a rerun of the same command after the
driver was stopped with ``--detach`` waits on them instead of submitting them again.
"""
from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import submitit

from nat_kd.artifacts import DistilledSet
from nat_kd.hashing import sha256_json
from nat_kd.errors import SettingsError
from nat_kd.launch import (GENERATOR, ClusterConfig, JobFailed, LaunchError, Submitted, add_launcher_arguments,
                           check_job, check_tables, job_result, make_executor, read_cluster_file, resubmits,
                           sbatch_lines, sbatch_script, sigterm_as_interrupt, still_running, submission, tail)

from .progress import ChunkStore, shard_chunks

logger = logging.getLogger("nat_kd.generate_distilled")


def add_arguments(parser) -> None:
    add_launcher_arguments(
        parser, "docs/generate_distilled.md",
        launcher="local (default): decode here; slurm: the --num-shards shards as one Slurm job array (submitit), "
                 "merged when the last ends; submitit-local: the same jobs as processes here",
        cluster="[launcher] (partition, account, max_jobs, max_retries, ...), [resources.distil] (gpus, gpu_type, "
                "cpus, mem_gb, hours, sbatch) of each shard's job and [resources.merge] of the merge job; the "
                "study's tables of the same file are ignored",
        dry_run="print the job array that would be submitted, with its sbatch options; run nothing",
        detach="on Ctrl-C or SIGTERM, leave the shards' jobs running (default: cancel them); the last one merges, "
               "and rerunning the command waits for them")


class ShardJob(submitit.helpers.Checkpointable):
    """A job's body: one shard decoded (what it has not saved yet); True if it also merged the set.
    Checkpointable: near Slurm's time limit submitit requeues it, and it goes on from its saved chunks."""

    def __call__(self, cfg, shard_id: int, num_shards: int) -> bool:
        from .pipeline import distill

        return distill(replace(cfg, shard_id=shard_id, num_shards=num_shards, merge_only=False,
                               progress_bar=False)).complete


def merge(cfg) -> bool:
    from .pipeline import distill

    return distill(replace(cfg, merge_only=True, progress_bar=False)).complete


class ShardLauncher:
    def __init__(self, cfg, launcher: str, cluster: ClusterConfig, detach: bool = False, where: str = "--cluster"):
        """``where``: the cluster file, for the messages."""
        if cfg.merge_only:
            raise LaunchError("--merge runs here: drop --launcher (the shards' jobs merge by themselves)")
        self.cfg, self.launcher, self.cluster, self.detach = cfg, launcher, cluster, detach
        self.num_shards = cfg.num_shards or 1
        self.out = Path(cfg.out_dir)
        self.folder = self.out.with_name(self.out.name + ".jobs")
        self.name, self.merge_name = f"nat_kd.distil.{self.out.name}", f"nat_kd.merge.{self.out.name}"
        # the generator's own options say how it decodes (--fp16, --compute-type): the study's fp16 is not read
        check_tables(cluster, GENERATOR, where, here={"fp16": "the teacher's precision here is --fp16"})
        self.resources = cluster.resources_for(GENERATOR, "distil")
        self.merge_resources = cluster.resources_for(GENERATOR, "merge")
        for kind, resources in (("distil", self.resources), ("merge", self.merge_resources)):
            check_job(resources, f"{where}: {self.name} [resources.{kind}]")
        if cfg.fp16 and not self.resources.gpus:
            raise SettingsError("--fp16 runs the teacher in half precision on a GPU: set [resources.distil] gpus = 1")
        # what the jobs compute: a marker left by another command is not waited on
        self.key = sha256_json({k: v for k, v in asdict(cfg).items() if k not in ("shard_id", "progress_bar")})

    def dry_run(self) -> list[str]:
        script = sbatch_script(self.resources, self.cluster.launcher, self.name, self.folder, array=self.num_shards)
        merge_script = sbatch_script(self.merge_resources, self.cluster.launcher, self.merge_name, self.folder)
        return ([f"{self.name}: an array of {self.num_shards} shard job(s) [{self.resources.describe()} each], "
                 "the last to finish merges"] + [f"    {line}" for line in sbatch_lines(script)]
                + [f"{self.merge_name}: only if no shard merged (all were done before) [{self.merge_resources.describe()}]"]
                + [f"    {line}" for line in sbatch_lines(merge_script)])

    def _marker(self, shard: int) -> Path:
        return self.folder / f"shard-{shard}.submitted.json"

    def _shard_done(self, shard: int) -> bool:
        """All the shard's chunks are saved (by an earlier run): nothing to submit for it."""
        store = ChunkStore(DistilledSet(self.out).progress_dir)
        plan = store.dir / "plan.json"
        if not plan.is_file():
            return False
        chunks = json.loads(plan.read_text(encoding="utf-8"))["chunks"]
        return all(store.is_done(i) for i in shard_chunks(len(chunks), shard, self.num_shards))

    def _executor(self):
        return make_executor(self.launcher, self.folder, self.resources, self.cluster.launcher, self.name)

    def _check(self) -> bool:
        """What each shard would refuse at its start, refused here before anything is submitted: the settings,
        the teacher (loaded on this machine), the corpus (its data folder and split), the batch size and the
        output folder; True if that folder holds this very set already (a rerun of a finished command)."""
        from .pipeline import already_done, check_set_folder, open_session

        # the backend's own check is about the decoding device (a GPU's compute types): here only for CPU shards
        session = open_session(self.cfg, "cpu", check_backend=not self.resources.gpus)
        session.batches()  # --max-tokens against the longest sentence
        out = DistilledSet(self.out)
        if already_done(out, session.fingerprint()) is not None:
            return True
        check_set_folder(out)
        try:  # the shards' progress, the jobs' files and the set are all written beside --out
            self.out.parent.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.out.parent).close()
        except OSError as err:
            raise SettingsError(f"--out {self.out}: cannot write in {self.out.parent} ({err.strerror}); choose a "
                                "folder that this machine and the jobs can write") from None
        return False

    def run(self) -> bool:
        """Decode every shard as jobs (resubmitting those killed from outside), merged; True once the set is
        complete. A shard that fails for good is reported once the others have ended."""
        if self._check():
            logger.info("%s is already complete (same teacher, corpus and settings): nothing to submit", self.out)
            return True
        jobs, to_submit = {}, []
        for shard in range(self.num_shards):
            previous = Submitted.read(self._marker(shard))
            if previous and previous.key == self.key and previous.launcher == self.launcher:
                job = previous.job()
                if still_running(job, self.launcher):
                    logger.info("shard %d: %s job %s from an earlier run is still running; waiting for it", shard,
                                self.launcher, job.job_id)
                    jobs[shard] = job
                    continue
            if not self._shard_done(shard):
                to_submit.append(shard)
        if to_submit:
            executor = self._executor()
            with submission():
                submitted = executor.map_array(ShardJob(), [self.cfg] * len(to_submit), to_submit,
                                               [self.num_shards] * len(to_submit))
            for shard, job in zip(to_submit, submitted):
                self._submitted(shard, job)
                jobs[shard] = job
            logger.info("submitted shards %s as %s job(s) %s (%s each)", to_submit, self.launcher,
                        ", ".join(str(j.job_id) for j in submitted), self.resources.describe())
        retries, merged, failures = dict.fromkeys(range(self.num_shards), 0), False, []
        try:
            while jobs:
                for shard, job in list(jobs.items()):
                    if still_running(job, self.launcher):
                        continue
                    del jobs[shard]
                    try:
                        merged = job_result(job, self.launcher) or merged
                        self._marker(shard).unlink(missing_ok=True)
                    except JobFailed as failed:
                        if not resubmits(failed, retries[shard], self.cluster.launcher, f"shard {shard}",
                                         "its saved chunks"):
                            failures.append(f"shard {shard} of {self.out} failed {retries[shard] + 1} time(s); the "
                                            f"last: {failed}" + tail(job.paths.stderr))
                            continue
                        retries[shard] += 1
                        try:
                            with submission():
                                job = self._executor().submit(ShardJob(), self.cfg, shard, self.num_shards)
                        except LaunchError as refused:
                            failures.append(f"shard {shard} of {self.out}: resubmitting it failed: {refused}")
                            continue
                        self._submitted(shard, job)
                        jobs[shard] = job
                if jobs:
                    time.sleep(self.cluster.launcher.poll_seconds)
        except BaseException:
            for shard, job in jobs.items():
                if self.detach:
                    logger.info("shard %d: %s job %s left running (--detach)", shard, self.launcher, job.job_id)
                else:
                    logger.info("shard %d: cancelling %s job %s", shard, self.launcher, job.job_id)
                    job.cancel(check=False)
            raise
        if failures:  # the other shards have ended: their chunks are saved for the next run
            raise LaunchError("\n".join(failures))
        if not merged:  # every shard was done before this run, or the last ones raced: merge in one more job
            executor = make_executor(self.launcher, self.folder, self.merge_resources, self.cluster.launcher,
                                     self.merge_name)
            with submission():
                job = executor.submit(merge, self.cfg)
            logger.info("merging in %s job %s", self.launcher, job.job_id)
            while still_running(job, self.launcher):
                time.sleep(self.cluster.launcher.poll_seconds)
            try:
                merged = job_result(job, self.launcher)
            except JobFailed as failed:
                raise LaunchError(f"merging {self.out} failed in {failed}") from None
        return merged

    def _submitted(self, shard: int, job) -> None:
        Submitted(self.launcher, str(job.job_id), str(self.folder), self.key).write(self._marker(shard))


def launch(args, cfg):
    """``python -m nat_kd.generate_distilled ... --launcher slurm``: the array until merged (its DistillResult);
    None after a dry run (printed) or a stop."""
    from .pipeline import DistillResult

    cluster = read_cluster_file(args.cluster) if args.cluster else ClusterConfig()
    launcher = ShardLauncher(cfg, args.launcher, cluster, args.detach, args.cluster or "--cluster")
    if args.dry_run:
        for line in launcher.dry_run():
            print(line)
        return None
    try:
        with sigterm_as_interrupt():
            launcher.run()
    except KeyboardInterrupt:
        print(f"the shards' jobs were {'left running' if args.detach else 'cancelled'}", file=sys.stderr)
        raise
    out = DistilledSet(cfg.out_dir)
    return DistillResult(out.root, True, out.meta())
