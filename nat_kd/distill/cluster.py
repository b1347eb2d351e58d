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

from nat_kd import atomic
from nat_kd.artifacts import DistilledSet
from nat_kd.hashing import sha256_json
from nat_kd.errors import SettingsError
from nat_kd.launch.arguments import add_launcher_arguments
from nat_kd.launch.jobs import JobFailed, Scheduler, Submitted, ended, queued_by_name, resubmits
from nat_kd.launch.sbatch import job_name, make_executor, sbatch_lines, sbatch_script, submission
from nat_kd.launch.settings import GENERATOR, ClusterConfig, LaunchError, check_job, check_tables, read_cluster_file
from nat_kd.launch.signals import critical, noting_sigterm, sigterm_as_interrupt, submitit_warnings_once

from .progress import ChunkStore, shard_chunks

logger = logging.getLogger("nat_kd.generate_distilled")


def add_arguments(parser) -> None:
    add_launcher_arguments(
        parser, 'docs/cluster.md, "The generator on a cluster"',
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

        with noting_sigterm(f"shard {shard_id}"):
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
        self.name = job_name(f"distil.{self.out.name}", self.out)
        self.merge_name = job_name(f"merge.{self.out.name}", self.out)
        # the generator's own options say how it decodes (--fp16, --compute-type): the study's fp16 is not read
        check_tables(cluster, GENERATOR, where, here={"fp16": "the teacher's precision here is --fp16"})
        self.resources = cluster.resources_for(GENERATOR, "distil")
        # one plan of batches for every shard and the merge: the default --max-tokens of the shards' device
        from .pipeline import with_batch_default

        self.cfg = with_batch_default(cfg, bool(self.resources.gpus))
        self.merge_resources = cluster.resources_for(GENERATOR, "merge")
        for kind, resources in (("distil", self.resources), ("merge", self.merge_resources)):
            check_job(resources, f"{where}: {self.name} [resources.{kind}]")
        if cfg.fp16 and not self.resources.gpus:
            raise SettingsError("--fp16 runs the teacher in half precision on a GPU: set [resources.distil] gpus = 1")
        # what the jobs compute: a marker left by another command is not waited on
        self.scheduler = Scheduler(launcher, cluster.launcher)
        self.jobs = {}  # shard (or "merge") -> its job while it is queued or running
        self.retries = dict.fromkeys(range(self.num_shards), 0)  # each shard's resubmissions that used up a retry
        self.stopped: dict[str, list[str]] = {"cancelled": [], "left running": []}
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
        from .pipeline import already_done, check_set_folder, load_run

        # the backend's own check is about the decoding device (a GPU's compute types): here only for CPU shards
        loaded = load_run(self.cfg, "cpu", check_backend=not self.resources.gpus)
        loaded.batches()  # --max-tokens against the longest sentence
        out = DistilledSet(self.out)
        if already_done(out, loaded.fingerprint()) is not None:
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
        """Decode every shard as jobs (resubmitting those stopped from outside their work), merged; True once the
        set is complete, its meta.json then listing every job with its end state. A shard that fails for good
        is reported once the others have ended. Stopped (Ctrl-C, SIGTERM), the driver cancels its jobs, or with
        ``detach`` leaves them running; ``stopped`` says which."""
        if self._check():
            logger.info("%s is already complete (same teacher, corpus and settings): nothing to submit", self.out)
            return True
        jobs, history = self.jobs, {shard: [] for shard in range(self.num_shards)}
        to_submit = self._adopt_running()
        merged, failures = False, []
        try:
            if to_submit:
                with critical(), submission(self.launcher):
                    submitted = self._executor().map_array(ShardJob(), [self.cfg] * len(to_submit), to_submit,
                                                           [self.num_shards] * len(to_submit))
                    for shard, job in zip(to_submit, submitted):
                        self._submitted(shard, job)
                        jobs[shard] = job
                logger.info("submitted shards %s as %s job(s) %s (%s each)", to_submit, self.launcher,
                            ", ".join(str(j.job_id) for j in submitted), self.resources.describe())
            while jobs:
                for shard, job in list(jobs.items()):
                    if self.scheduler.running(job):
                        continue
                    try:
                        merged = self.scheduler.outcome(job) or merged
                    except JobFailed as failed:
                        if failed.requeued:  # the same job, back in the scheduler's queue
                            logger.warning("shard %d: %s", shard, failed)
                            continue
                        del jobs[shard]
                        history[shard].append(ended(job.job_id, failed.state))
                        failure = self._again(shard, failed, history[shard])
                        if failure:
                            failures.append(failure)
                        continue
                    del jobs[shard]
                    history[shard].append(ended(job.job_id, "COMPLETED"))
                    self._marker(shard).unlink(missing_ok=True)
                if jobs:
                    time.sleep(self.cluster.launcher.poll_seconds)
        except BaseException:
            for shard, job in list(jobs.items()):
                self._stop_one(shard, job)
            raise
        if failures:  # the other shards have ended: their chunks are saved for the next run
            raise LaunchError("\n".join(failures))
        if not merged:  # every shard was done before this run, or the last ones raced: merge in one more job
            merged = self._merge()
        self._record(history)
        return merged

    def _adopt_running(self) -> list[int]:
        """The shards still to submit; an earlier run's job still running for a shard is waited on instead (in
        ``jobs``)."""
        to_submit = []
        for shard in range(self.num_shards):
            previous = Submitted.read(self._marker(shard))
            if previous and previous.key == self.key and previous.launcher == self.launcher:
                job = previous.job()
                if self.scheduler.running(job):
                    logger.info("shard %d: %s job %s from an earlier run is still running; waiting for it", shard,
                                self.launcher, job.job_id)
                    self.jobs[shard] = job
                    continue
            if not self._shard_done(shard):
                to_submit.append(shard)
        if self.launcher == "slurm" and to_submit:
            self._refuse_unmarked()
        return to_submit

    def _refuse_unmarked(self) -> None:
        """A LaunchError if Slurm's queue holds a job of this set's name (unique to it) that no marker names: a
        run stopped between sbatch and its markers left it, and which shard it decodes is not known, so a new
        job for the shard could decode beside it."""
        adopted = {str(job.job_id) for job in self.jobs.values()}
        unmarked = [job_id for job_id in queued_by_name(self.name) or [] if job_id not in adopted]
        if unmarked:
            raise LaunchError(f"{self.out}: slurm job(s) {', '.join(unmarked)}, named {self.name}, are in the queue "
                              f"but no marker in {self.folder} names them (an earlier run lost their ids): wait for "
                              f"them to end or cancel them (scancel {' '.join(unmarked)}), then run again")

    def _again(self, shard: int, failed: JobFailed, history: list[dict]) -> str | None:
        """A failed shard resubmitted (stopped from outside its work, retries left: its new job in ``jobs``), or
        the line that reports it (its last job's failure, the jobs before it, and the log)."""
        if resubmits(failed, self.retries[shard], self.cluster.launcher, f"shard {shard}", "its saved chunks"):
            self.retries[shard] += failed.counted
            try:
                with critical(), submission(self.launcher):
                    job = self._executor().submit(ShardJob(), self.cfg, shard, self.num_shards)
                    self._submitted(shard, job)
                    self.jobs[shard] = job
                return None
            except LaunchError as refused:
                return f"shard {shard} of {self.out}: resubmitting it failed: {refused}"
        earlier = (f" (after {len(history) - 1} resubmission(s): "
                   + ", ".join(f"job {e['job_id']} {e['state']}" for e in history[:-1]) + ")" if len(history) > 1
                   else "")
        return f"shard {shard} of {self.out} failed in {failed}{earlier}; log: {failed.log}"

    def _merge(self) -> bool:
        """The set merged by one more job, on a CPU ([resources.merge])."""
        executor = make_executor(self.launcher, self.folder, self.merge_resources, self.cluster.launcher,
                                 self.merge_name)
        try:
            with critical(), submission(self.launcher):
                job = self.jobs["merge"] = executor.submit(merge, self.cfg)
            logger.info("merging in %s job %s", self.launcher, job.job_id)
            while self.scheduler.running(job):
                time.sleep(self.cluster.launcher.poll_seconds)
            merged = self.scheduler.outcome(job)
            del self.jobs["merge"]
            return merged
        except JobFailed as failed:
            raise LaunchError(f"merging {self.out} failed in {failed}; log: {failed.log}") from None
        except BaseException:
            for name, job in list(self.jobs.items()):
                self._stop_one(name, job)
            raise

    def stop_report(self) -> str:
        """What a stopped driver did with its jobs, in one line."""
        parts = [f"{what}: {', '.join(jobs)}" for what, jobs in self.stopped.items() if jobs]
        if self.stopped["left running"]:
            parts.append("rerunning the same command waits for them")
        return "; ".join(parts) if parts else "no job was running"

    def _stop_one(self, shard, job) -> None:
        """Cancel a job of the driver's (or with ``detach`` leave it running), noted in ``stopped``; a shard's
        marker goes only with its job, so that a rerun waits on a job that could not be cancelled."""
        label = f"{'shard ' if shard != 'merge' else ''}{shard} ({self.launcher} job {job.job_id})"
        if self.detach:
            logger.info("%s left running (--detach)", label)
            self.stopped["left running"].append(label)
        elif self.scheduler.cancel(job):
            logger.info("%s cancelled", label)
            if shard != "merge":
                self._marker(shard).unlink(missing_ok=True)
            self.stopped["cancelled"].append(label)
        else:
            self.stopped["left running"].append(label)
        self.jobs.pop(shard, None)

    def _record(self, history: dict[int, list[dict]]) -> None:
        """Every job of this run, by shard, with its end state, in the set's meta.json (as "jobs" of
        "launcher")."""
        out = DistilledSet(self.out)
        meta = out.meta()
        if meta is None or not any(history.values()):
            return
        meta["launcher"] = {"launcher": self.launcher, "jobs": [{"shard": shard, **job} for shard, jobs in
                                                                history.items() for job in jobs]}
        atomic.write_json(out.meta_file, meta)

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
    submitit_warnings_once()
    with sigterm_as_interrupt():  # the line too: a signal after the handlers are restored would end the driver first
        try:
            launcher.run()
        except KeyboardInterrupt:
            print(f"jobs: {launcher.stop_report()}", file=sys.stderr)
            raise
    out = DistilledSet(cfg.out_dir)
    return DistillResult(out.root, True, out.meta())
