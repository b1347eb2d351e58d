"""Running work as cluster jobs through submitit (the engine of fairseq's and Hydra's Slurm launchers).

The study driver (``nat_kd.study``) submits its steps and the generator (``nat_kd.generate_distilled``) its
shards through this module. It holds what the two share: the ``[launcher]`` settings and the
``[resources.KIND]`` tables of a TOML file (one file serves both: each reads its own kinds and notes the
other's), the submitit executor they make, the sbatch script a ``--dry-run`` prints, how a job's Slurm state is
read (still running, ended from outside and worth resubmitting, or ended for good), and how a submitted job is
found again by a later run (a detached driver's jobs).

Launchers: ``local`` (the commands' own in-process runs: nothing here is used), ``slurm`` (sbatch), and
``submitit-local`` (submitit's LocalExecutor: each job a process on this machine, through the same code as
``slurm``; for trying a cluster set-up, and for the tests).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys
import tomllib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from nat_kd import atomic
from nat_kd.errors import NatKdError

logger = logging.getLogger("nat_kd.launch")
LAUNCHERS = ("local", "slurm", "submitit-local")
# submitit's own names for the two cluster launchers (``debug`` runs jobs in the driver: the tests use it)
_SUBMITIT_CLUSTER = {"slurm": "slurm", "submitit-local": "local", "debug": "debug"}


class LaunchError(NatKdError):
    """Bad [launcher]/[resources] settings, or a job that could not be submitted."""


@dataclass(frozen=True)
class Resources:
    """What one job asks the scheduler for (one node, one task: a multi-GPU fairseq-train spawns its own
    processes, one per GPU), and how its GPU work runs."""
    gpus: int = 0
    cpus: int = 1
    mem_gb: float = 8.0
    hours: float = 1.0
    gpu_type: str | None = None  # --gpus-per-node=TYPE:N (default: [launcher] gpu_type)
    sbatch: dict = field(default_factory=dict)  # this kind's own sbatch options, over [launcher] sbatch
    fp16: bool = False  # training and decoding in half precision (GPU jobs that take it)
    save_updates: int = 0  # training: a checkpoint every N updates (0: fairseq's one an epoch)

    def describe(self) -> str:
        gpu = f" ({self.gpu_type})" if self.gpu_type and self.gpus else ""
        return (f"{self.gpus} GPU{gpu}, {self.cpus} CPU, {self.mem_gb:g} GB, {self.hours:g} h"
                + (", fp16" if self.fp16 else "") + (f", saved every {self.save_updates} updates"
                                                     if self.save_updates else ""))


@dataclass(frozen=True)
class LauncherSettings:
    """The ``[launcher]`` table."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    max_jobs: int = 64  # jobs in the queue at once (the study submits what is ready; a job array runs this many)
    setup: tuple[str, ...] = ()  # shell lines the job script runs first (module load ..., source .venv/bin/activate)
    gpu_type: str | None = None  # the GPU type of every job that asks for GPUs: --gpus-per-node=TYPE:N
    sbatch: dict = field(default_factory=dict)  # any other sbatch option of every job, e.g. {mail_type = "FAIL"}
    poll_seconds: float = 30.0  # how often the driver asks the scheduler about its jobs
    max_retries: int = 2  # how often a job ended from outside its work (RETRIED_STATES) is resubmitted


# One cluster file serves both commands that submit jobs. What each kind of job asks for unless
# [resources.KIND] (or the study's [resources."STEP NAME"]) says otherwise, sized for the paper profile on one GPU
# a model job (docs/study.md, "On a cluster": where the hours come from)
STUDY, GENERATOR = "python -m nat_kd.study", "python -m nat_kd.generate_distilled"
JOB_RESOURCES = {
    "prepare": Resources(gpus=0, cpus=4, mem_gb=16, hours=4),  # sentencepiece and binarizing, CPU only
    # fairseq-train, then decoding valid and test; a checkpoint every 2,000 updates (about half an hour of a
    # base model on one GPU, a tenth of a WMT14 epoch) is what a requeued job does again at most
    "train": Resources(gpus=1, cpus=8, mem_gb=32, hours=72, save_updates=2000),
    "distil": Resources(gpus=1, cpus=8, mem_gb=32, hours=24),  # one teacher decoding the training set (or a shard)
    "mix": Resources(gpus=0, cpus=4, mem_gb=16, hours=4),  # a distilled set with real targets mixed in, binarized
    "analysis": Resources(gpus=0, cpus=2, mem_gb=32, hours=24),  # fast_align-style tables over every set
    # decoding and training speed: timed on one thread each, so on CPUs; the second core keeps the job's own
    # bookkeeping off the timed one
    "speed": Resources(gpus=0, cpus=2, mem_gb=16, hours=24),
    "modes": Resources(gpus=0, cpus=2, mem_gb=16, hours=2),  # unigram language models and a few test sets
    # the generator's merge when no shard merged: reading the chunks, binarizing (CPU work of minutes)
    "merge": Resources(gpus=0, cpus=4, mem_gb=32, hours=2),
}
# [resources] keys about a job's work rather than its size, and the kinds whose work reads each, by command: a
# kind without gpus runs on CPUs only, fp16 and save_updates are read by the study's jobs (the generator's
# precision is its --fp16)
WORK_KEYS = ("gpus", "gpu_type", "fp16", "save_updates")
KINDS = {STUDY: {"prepare": (), "train": WORK_KEYS, "distil": ("gpus", "gpu_type", "fp16"), "mix": (),
                 "analysis": (), "speed": (), "modes": ()},
         GENERATOR: {"distil": ("gpus", "gpu_type"), "merge": ()}}

# the study's steps named without a dot that are not a job kind: the generator, which knows no study's plan, tells
# their tables from a misspelt kind by this list (tests/test_cluster.py keeps it to the bundled profiles' steps)
STUDY_STEPS_WITHOUT_A_DOT = ("training_speed",)

# the type of each key of [launcher] and [resources.KIND] that is not a string
_TYPES = {"setup": list, "sbatch": dict, "max_jobs": int, "max_retries": int, "gpus": int, "cpus": int,
          "mem_gb": (int, float), "hours": (int, float), "poll_seconds": (int, float), "fp16": bool,
          "save_updates": int}
# the least of each number (sbatch refuses a job array of --array=0-15%0, a --time=0 means no limit at all)
_LEAST = {"max_jobs": 1, "cpus": 1, "gpus": 0, "max_retries": 0, "save_updates": 0}
_POSITIVE = ("mem_gb", "hours", "poll_seconds")
# a GPU type as sbatch's --gpus-per-node=TYPE:N takes it (the count comes from gpus)
_GPU_TYPE = re.compile(r"[A-Za-z0-9][\w.-]*")
# sbatch options that ask for GPUs: beside submitit's --gpus-per-node (which `gpus` and `gpu_type` make) recent
# Slurm refuses them, and on a CPU job they would put a GPU where none is used
GPU_COUNT_OPTIONS = ("gpus", "gpus_per_node", "gpus_per_task", "gpus_per_socket", "num_gpus")
# sbatch options about the GPUs a job has: for GPU jobs only, so never in [launcher] sbatch (every job's)
GPU_OPTIONS = ("cpus_per_gpu", "mem_per_gpu", "gpu_bind", "gpu_freq")


def _sbatch_options(options: dict, where: str, every_job: bool) -> dict:
    """An sbatch table, its keys as submitit writes them (gpu-bind and gpu_bind are one option), without the
    options that ask for GPUs; ``every_job``: [launcher] sbatch, which CPU jobs get too."""
    options = {key.replace("-", "_"): value for key, value in options.items()}
    for key, value in options.items():
        if key in GPU_COUNT_OPTIONS or (key == "gres" and "gpu" in str(value)):
            raise LaunchError(f"{where}.sbatch: {key} = {value!r} would mix with the --gpus-per-node the jobs get "
                              "from gpus: set [resources.KIND] gpus = N and gpu_type = \"TYPE\" (e.g. \"a100\") "
                              "instead")
        if every_job and key in GPU_OPTIONS:
            raise LaunchError(f"{where}.sbatch: {key} would reach the CPU jobs too: move it to the sbatch table of "
                              "a GPU kind, [resources.KIND] sbatch = {...}")
    return options


def _checked(cls, table: dict, where: str):
    """A dataclass from a TOML table, every key known and of its type."""
    table, values = dict(table), {}
    for f in fields(cls):
        if f.name not in table:
            continue
        value, expected = table.pop(f.name), _TYPES.get(f.name, str)
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            name = getattr(expected, "__name__", "a number")
            raise LaunchError(f"{where}.{f.name} = {value!r}: expected {name}")
        least = _LEAST.get(f.name)
        if (least is not None and value < least) or (f.name in _POSITIVE and value <= 0):
            raise LaunchError(f"{where}.{f.name} = {value!r}: must be "
                              + (f"{least} or more" if least is not None else "more than 0"))
        if f.name == "gpu_type" and not _GPU_TYPE.fullmatch(value):
            raise LaunchError(f'{where}.{f.name} = {value!r}: a GPU type alone (e.g. "h100"); the count is gpus')
        if f.name == "sbatch":
            value = _sbatch_options(value, where, every_job=cls is LauncherSettings)
        values[f.name] = tuple(value) if f.name == "setup" else value
    if table:
        raise LaunchError(f"{where}: unknown key(s) {', '.join(sorted(table))}; known: "
                          f"{', '.join(f.name for f in fields(cls))}")
    return cls(**values)


@dataclass(frozen=True)
class ClusterConfig:
    """``[launcher]`` and ``[resources]`` of a config: how jobs are submitted and what each kind asks for.

    ``resources`` maps a job kind (JOB_RESOURCES) or a study step's name to its overrides of the defaults."""
    launcher: LauncherSettings = field(default_factory=LauncherSettings)
    resources: dict = field(default_factory=dict)  # kind or step name -> {gpus, cpus, mem_gb, hours, ...}

    def resources_for(self, command: str, kind: str, name: str | None = None) -> Resources:
        """What a job of ``command`` asks for: the kind's default, under the [resources.KIND] keys, under the
        [resources."STEP NAME"] keys (an sbatch table adds its options to the kind's); only the keys the command
        reads of the kind (check_tables has noted the others); a GPU job without a gpu_type of its own gets
        [launcher]'s, so that its record says what it asked for."""
        out = JOB_RESOURCES.get(kind, Resources())
        reads = KINDS[command].get(kind, WORK_KEYS)  # a kind of neither command (the tests' own) reads them all
        for key in (kind, name):
            if key in self.resources:
                table = {k: v for k, v in self.resources[key].items() if k not in WORK_KEYS or k in reads}
                out = replace(out, **{**table, "sbatch": {**out.sbatch, **table.get("sbatch", {})}})
        if out.gpus and not out.gpu_type:
            out = replace(out, gpu_type=self.launcher.gpu_type)
        return out

    def over(self, other: ClusterConfig) -> ClusterConfig:
        """This config with ``other``'s tables over it (a --cluster file over a profile's)."""
        launcher = replace(self.launcher, **{f.name: getattr(other.launcher, f.name)
                                             for f in fields(LauncherSettings)
                                             if getattr(other.launcher, f.name) != getattr(LauncherSettings(), f.name)})
        resources = {k: {**self.resources.get(k, {}), **v} for k, v in {**self.resources, **other.resources}.items()}
        return ClusterConfig(launcher, resources)


def table_name(key: str) -> str:
    """A [resources] table as the file spells it (a step name holds a dot, so it is quoted)."""
    return f'[resources."{key}"]' if "." in key else f"[resources.{key}]"


def check_tables(cluster: ClusterConfig, command: str, where: str, steps: dict[str, str] | None = None,
                 here: dict[str, str] | None = None) -> None:
    """The [resources] tables as ``command`` reads them, checked before anything is submitted: a table names a
    job kind, or a step of the study (``steps``: its step names and their kinds); a key about the work names
    work that reads it. What is only the other command's (its kinds, the study's step tables in the generator,
    a key its jobs of the kind read) is ignored, in one note on stderr; ``here``: the command's own option for
    such a key, named in the note. Anything else is a mistake: a LaunchError naming ``where`` (the file), the
    table and the key."""
    other = GENERATOR if command == STUDY else STUDY
    ignored = []
    for key, table in cluster.resources.items():
        kind = (steps or {}).get(key, key)
        if kind not in KINDS[command]:
            if kind in KINDS[other] or (command == GENERATOR and ("." in key or key in STUDY_STEPS_WITHOUT_A_DOT)):
                ignored.append(table_name(key))
                continue
            step = (f"a step of this study ({STUDY} CONFIG --list names them)" if command == STUDY
                    else 'a step of a study (a quoted name with a dot, e.g. [resources."teacher.big"])')
            raise LaunchError(f"{where}: {table_name(key)} is neither a job kind ({', '.join(JOB_RESOURCES)}) "
                              f"nor {step}")
        for name in WORK_KEYS:
            value = table.get(name)
            if not value or name in KINDS[command][kind]:
                continue  # gpus = 0, fp16 = false: what a CPU job has anyway
            if name in KINDS[other].get(kind, ()):
                ignored.append(f"{table_name(key)} {name}" + (f" ({here[name]})" if name in (here or {}) else ""))
            elif name == "gpus":
                raise LaunchError(f"{where}: {table_name(key)}.gpus = {value!r}: {kind} jobs run on CPUs only, so "
                                  f"the GPU would sit idle for the job's time; drop gpus")
            else:
                readers = sorted({k for kinds in KINDS.values() for k, reads in kinds.items() if name in reads})
                raise LaunchError(f"{where}: {table_name(key)}.{name} = {value!r}: only {' and '.join(readers)} "
                                  f"jobs read {name}; drop it")
    if ignored:
        print(f"note: {where}: ignored here, for {other}: {', '.join(ignored)}", file=sys.stderr)


def add_launcher_arguments(parser, docs: str, *, launcher: str, cluster: str, dry_run: str, detach: str) -> None:
    """--launcher, --cluster, --dry-run and --detach in an "on a cluster" group; each command says in its help
    what a job is for it (a study step, a generator shard)."""
    group = parser.add_argument_group(f"on a cluster ({docs}, \"On a cluster\")")
    group.add_argument("--launcher", choices=LAUNCHERS, default="local", help=launcher)
    group.add_argument("--cluster", metavar="CLUSTER.toml", help=cluster)
    group.add_argument("--dry-run", action="store_true", help=dry_run)
    group.add_argument("--detach", action="store_true", help=detach)


def check_launcher_arguments(args) -> None:
    """--detach and --cluster are about jobs, which the local launcher has none of: refused rather than ignored
    (--cluster goes with --dry-run, which prints the jobs whatever the launcher)."""
    if args.launcher != "local":
        return
    given = [flag for flag, value in (("--detach", args.detach), ("--cluster", args.cluster and not args.dry_run))
             if value]
    if given:
        raise LaunchError(f"{' and '.join(given)} without --launcher: the local launcher runs everything in this "
                          f"command, with no jobs; give --launcher slurm (or submitit-local), or leave "
                          f"{'them' if len(given) > 1 else 'it'} out")


def cluster_config(tables: dict, where: str = "") -> ClusterConfig:
    """``[launcher]`` and ``[resources.*]`` read and checked (``where``: the file, for the messages)."""
    prefix = f"{where}: " if where else ""
    try:
        launcher = _checked(LauncherSettings, tables.get("launcher", {}), "[launcher]")
        resources = {}
        for key, table in tables.get("resources", {}).items():
            if not isinstance(table, dict):
                raise LaunchError(f"[resources].{key}: expected a table [resources.{key}] of gpus, cpus, mem_gb, "
                                  "hours, ...")
            resources[key] = {k: v for k, v in asdict(_checked(Resources, table, f"[resources.{key}]")).items()
                              if k in table}
    except LaunchError as err:
        raise LaunchError(prefix + str(err)) from None
    return ClusterConfig(launcher, resources)


def read_cluster_file(path: str | Path) -> ClusterConfig:
    """A ``--cluster FILE.toml``: [launcher] and [resources.*] only."""
    path = Path(path)
    try:
        tables = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise LaunchError(f"{path}: {err}") from None
    if set(tables) - {"launcher", "resources"}:
        raise LaunchError(f"{path}: a cluster file holds [launcher] and [resources.*] only, not "
                          f"{', '.join(sorted(set(tables) - {'launcher', 'resources'}))}")
    return cluster_config(tables, str(path))


def check_job(resources: Resources, where: str) -> None:
    """What one job asks for fits together, before anything is submitted (``where``: the job and its tables,
    for the message): nothing about GPUs on a job without one."""
    if not resources.gpus:
        asks = [key for key in ("fp16", "gpu_type") if getattr(resources, key)]
        asks += [f"sbatch {key}" for key in GPU_OPTIONS if key in resources.sbatch]
        if asks:
            raise LaunchError(f"{where}: {', '.join(asks)} on a job without a GPU (gpus = 0): set gpus = 1, or drop "
                              "it")


def executor_parameters(resources: Resources, settings: LauncherSettings, name: str,
                        after: tuple[str, ...] = ()) -> dict:
    """submitit's AutoExecutor parameters of one job; ``after``: the ids of the jobs it waits for (Slurm's
    afterok dependency)."""
    params = {"name": name, "timeout_min": max(1, round(resources.hours * 60)), "nodes": 1, "tasks_per_node": 1,
              "cpus_per_task": resources.cpus, "mem_gb": resources.mem_gb, "slurm_setup": list(settings.setup),
              # a job array (the generator's shards) runs at most max_jobs tasks at once
              "slurm_array_parallelism": settings.max_jobs}
    if resources.gpus:  # no GPU: no gres request at all (some CPU partitions refuse even --gpus-per-node=0)
        params["gpus_per_node"] = resources.gpus  # an int for submitit-local, which hands out GPUs itself
        if resources.gpu_type:
            params["slurm_gpus_per_node"] = f"{resources.gpu_type}:{resources.gpus}"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(settings, key):
            params[f"slurm_{key}"] = getattr(settings, key)
    additional = {**settings.sbatch, **resources.sbatch}
    if after:
        params["slurm_dependency"] = "afterok:" + ":".join(after)
        # a job whose dependency failed leaves the queue instead of waiting there for ever
        additional["kill_on_invalid_dep"] = "yes"
    if additional:
        params["slurm_additional_parameters"] = additional
    return params


def make_executor(launcher: str, folder: Path, resources: Resources, settings: LauncherSettings, name: str,
                  after: tuple[str, ...] = ()):
    """A submitit executor for one job (or one array) of ``resources``, its files in ``folder``."""
    import submitit

    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=_SUBMITIT_CLUSTER[launcher])
    except RuntimeError as err:  # no srun on this machine
        raise LaunchError(f"--launcher {launcher}: {err} (try --dry-run to see the jobs)") from None
    executor.update_parameters(**executor_parameters(resources, settings, name, after))
    return executor


@contextmanager
def submission():
    """Around a submission: the scheduler's refusal (sbatch's own message: a time limit above the partition's,
    an unknown account) raised as a LaunchError, on one line."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    try:
        yield
    except (FailedJobError, FailedSubmissionError, OSError) as err:
        message = " ".join(str(err).split()) or type(err).__name__
        raise LaunchError(f"the job could not be submitted: {message}") from None


# AutoExecutor's generic names as SlurmExecutor's (submitit's own equivalence table, which needs an executor
# made on a Slurm machine)
_SLURM_NAMES = {"name": "job_name", "timeout_min": "time", "mem_gb": "mem", "tasks_per_node": "ntasks_per_node"}


def sbatch_script(resources: Resources, settings: LauncherSettings, name: str, folder: Path,
                  array: int | None = None, after: tuple[str, ...] = ()) -> str:
    """The sbatch script submitit writes for this job (an array of ``array`` tasks), made without Slurm by
    submitit's own renderer from the parameters ``make_executor`` gives it."""
    from submitit.slurm.slurm import _convert_mem, _make_sbatch_string

    # the generic names first, so that a slurm_ name wins, as in submitit's AutoExecutor
    params = sorted(executor_parameters(resources, settings, name, after).items(),
                    key=lambda item: item[0].startswith("slurm_"))
    params = {_SLURM_NAMES.get(key, key.removeprefix("slurm_")): value for key, value in params}
    params["mem"] = _convert_mem(params["mem"])
    params["setup"] = params["setup"] or None
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return _make_sbatch_string(command=command, folder=folder, map_count=array, **params)


def sbatch_lines(script: str) -> list[str]:
    """What a dry run prints of a script: its ``#SBATCH`` options but the log files (submitit's names in the
    job's folder), then the setup lines the job runs first."""
    options = [line for line in script.splitlines()
               if line.startswith("#SBATCH") and not line.startswith(("#SBATCH --output", "#SBATCH --error"))]
    setup = script.split("\n# setup\n", 1)[1].split("\n\n", 1)[0].splitlines() if "\n# setup\n" in script else []
    return options + (["# setup", *setup] if setup else [])


# ---------------------------------------------------------------- submitted jobs, found again later

@dataclass(frozen=True)
class Submitted:
    """A job this or an earlier run submitted, as written to its marker file: enough to find it again."""
    launcher: str
    job_id: str
    folder: str
    key: str  # what the job computes (a step's fingerprint): a marker for other work is stale

    def write(self, path: Path) -> None:
        atomic.write_json(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> Submitted | None:
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def job(self):
        """The submitit job, re-created from its id and folder (what a detached driver left running)."""
        import submitit

        if self.launcher == "slurm":
            return submitit.SlurmJob(folder=self.folder, job_id=self.job_id)
        return submitit.local.local.LocalJob(folder=self.folder, job_id=self.job_id)

    def state(self, job=None) -> str:
        """The job's state now: Slurm's own (sacct: PENDING, RUNNING, FAILED, ...), or for submitit-local
        RUNNING or ENDED. ``job``: ``self.job()`` made beforehand (submitit asks sacct about every job made so
        far in one call)."""
        job = job or self.job()
        if self.launcher == "slurm":
            return job.state
        return "RUNNING" if still_running(job, self.launcher) else "ENDED"


def still_running(job, launcher: str) -> bool:
    """Whether a job (maybe re-created from a marker, without its process handle) is queued or running."""
    if launcher == "debug":
        return False
    if launcher == "submitit-local":
        process = getattr(job, "_process", None)
        if process is not None:
            return process.poll() is None
        if job.paths.result_pickle.exists():
            return False
        return _process_alive(job.job_id)  # a LocalExecutor job's id is its controller's pid
    # submitit's shared watcher asks sacct about all the jobs in one call, at most every minute; not its
    # job.done(), which counts PREEMPTED as unfinished: where preemption cancels, the driver would wait for ever
    return not job.paths.result_pickle.exists() and classify(job.state) == "active"


def _process_alive(pid: str) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not reaped by its orphaned parent, does not)."""
    try:
        os.kill(int(pid), 0)
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# Slurm's states of a job that will still run: queued, running, or requeued by Slurm itself (submitit's requeue
# near the time limit, a preemption that requeues), which runs it again under the same id; UNKNOWN is
# submitit's until sacct knows a new job
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                 "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "READY", "UNKNOWN")
# the end states of a job stopped by a cause outside its work, so that running it again may succeed: preempted
# (where preemption cancels), its node failed or did not boot, its time limit (after submitit's requeues);
# submitit-local's job killed by a signal stands for these. Any other end is final: the job's own error, out of
# memory, cancelled, and also a COMPLETED job without a result.
RETRIED_STATES = ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "INTERRUPTED")


def classify(state: str) -> str:
    """A job's state as the drivers of both commands treat it: "active", "retried" or "final" (above); sacct's
    "CANCELLED by 1000" is CANCELLED."""
    state = state.split(" ")[0].upper()
    return "active" if state in ACTIVE_STATES else "retried" if state in RETRIED_STATES else "final"


class JobFailed(Exception):
    """A job that ended without its result: the message says which job and why; ``retry`` is its end state
    when that is a RETRIED_STATES one (running it again may succeed), else None."""

    def __init__(self, message: str, retry: str | None):
        super().__init__(message)
        self.retry = retry


def job_result(job, launcher: str):
    """The result of a job that is no longer running (``still_running``), else JobFailed."""
    from submitit.core.utils import UncompletedJobError

    try:
        if not job.paths.result_pickle.exists() and classify(job.state) == "retried":
            # submitit's result() would wait for a PREEMPTED job to end, for ever
            raise UncompletedJobError(f"has not produced any output (state: {job.state})")
        return job.result()
    except Exception as err:  # noqa: BLE001 - the job's own error (its traceback), or the scheduler's end of it
        state = str(job.state).split(" ")[0].upper() if _left_no_result(err) else ""
        raise JobFailed(job_failure(job, launcher, err), state if classify(state) == "retried" else None) from None


def _left_no_result(error: BaseException) -> bool:
    """Whether a job's result() raised because the job left no result (the scheduler ended it), rather than
    the job's own error (submitit's FailedJobError, a kind of UncompletedJobError, holds its traceback)."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    return isinstance(error, UncompletedJobError) and not isinstance(error, FailedJobError)


def resubmits(failed: JobFailed, retries: int, settings: LauncherSettings, what: str, resumes: str) -> bool:
    """Whether a job that failed is submitted again, having been ``retries`` times already: only for a cause
    outside its work (its own error would fail the same way again), up to [launcher] max_retries; says so."""
    if failed.retry is None or retries >= settings.max_retries:
        return False
    logger.warning("%s was stopped from outside its work (%s); resubmitting it (retry %d of %d), it resumes from "
                   "%s", what, failed.retry, retries + 1, settings.max_retries, resumes)
    return True


def wait_for(job, launcher: str, poll_seconds: float, stop) -> None:
    """Block until ``job`` ends, or ``stop`` (a threading.Event) is set: then raise ``Stopped``."""
    while still_running(job, launcher):
        if stop.wait(poll_seconds):
            raise Stopped(f"job {job.job_id} left running")
    if stop.is_set():
        raise Stopped(f"job {job.job_id}")


class Stopped(Exception):
    """The driver was told to stop (SIGINT/SIGTERM) while it waited on a job."""


def tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a log, indented (empty if there is no such file)."""
    if path is None or not Path(path).is_file():
        return ""
    text = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return "\n    " + "\n    ".join(text) if text else ""


def job_failure(job, launcher: str, error: BaseException) -> str:
    """Which job failed and why (``error``: what its result raised): the job's own exception's last line, or
    for a job that left no result (timed out, out of memory, cancelled) the scheduler's state with the last line
    of its error stream. A job that raised has no state here: sacct may not have seen it end yet (RUNNING)."""
    lines = [line.strip() for line in str(error).splitlines()]
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Interrupt|Exit)\b", line)]
    cause = raised[-1] if raised else next((line for line in lines if line), type(error).__name__)
    state = f", state {job.state}" if _left_no_result(error) and launcher != "debug" else ""
    return f"{launcher} job {job.job_id}{state}: {cause}\n  job stderr: {job.paths.stderr}"


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM (scancel of the driver, a kill) raises KeyboardInterrupt like Ctrl-C while the block runs, so
    the driver cancels or leaves its jobs as it does on SIGINT instead of dying on the spot.

    SIGINT raises it too, also in a driver started with SIGINT ignored (``nohup ... &`` in a script):
    otherwise the processes started in the block would inherit the ignored signal, and submitit-local cancels a
    job by SIGINT to its controller process, which would then run on beside the rerun that does its step again.
    The driver itself then stops on SIGINT too, which is safe: every such command resumes where it stopped."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous_term = signal.signal(signal.SIGTERM, interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
