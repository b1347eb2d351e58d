"""The ``[launcher]`` and ``[resources.KIND]`` tables of a cluster file, and what each job asks for.

One cluster file serves both commands that submit jobs (the study's steps, the generator's shards): each reads
its own kinds of job and notes the other's. Everything is checked before anything is submitted, each problem one
line naming the file, the table and the key (nat_kd.settings_file).
"""
from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from nat_kd.errors import NatKdError
from nat_kd.settings_file import POSITIVE, check_value, dataclass_from_table, least, most, read_toml

LAUNCHERS = ("local", "slurm", "submitit-local")


class LaunchError(NatKdError):
    """Bad [launcher]/[resources] settings, or a job that could not be submitted."""


@dataclass(frozen=True)
class Resources:
    """What one job asks the scheduler for (one node, one task: a multi-GPU fairseq-train spawns its own
    processes, one per GPU), and how its GPU work runs."""
    gpus: int = field(default=0, metadata=least(0))
    cpus: int = field(default=1, metadata=least(1))
    mem_gb: float = field(default=8.0, metadata=least(0.001, "less is --mem=0MB, which Slurm reads as all of a "
                                                           "node's memory"))
    hours: float = field(default=1.0, metadata={**POSITIVE, **most(8760, "a year")})  # sbatch --time (the one way)
    gpu_type: str | None = None  # --gpus-per-node=TYPE:N (default: [launcher] gpu_type)
    sbatch: dict = field(default_factory=dict)  # this kind's own sbatch options, over [launcher] sbatch
    fp16: bool = False  # training and decoding in half precision (GPU jobs that take it)
    # training: a checkpoint every N updates (0: fairseq's one an epoch)
    save_updates: int = field(default=0, metadata=least(0))

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
    # jobs in the queue at once (the study submits what is ready; a job array runs this many)
    max_jobs: int = field(default=64, metadata=least(1))
    setup: tuple[str, ...] = ()  # shell lines the job script runs first (module load ..., source .venv/bin/activate)
    gpu_type: str | None = None  # the GPU type of every job that asks for GPUs: --gpus-per-node=TYPE:N
    sbatch: dict = field(default_factory=dict)  # any other sbatch option of every job, e.g. {mail_type = "FAIL"}
    # how often the driver asks the scheduler about its jobs: one sacct call for all of them (nat_kd.launch.jobs)
    poll_seconds: float = field(default=30.0, metadata={**POSITIVE, **most(3600, "an hour: a job's end would be "
                                                                             "seen that late")})
    # how often a job ended from outside its work (RETRIED_STATES) is resubmitted
    max_retries: int = field(default=2, metadata=least(0))
    # how long a job may go on without an end state the scheduler confirms, before it counts as ended: one that
    # neither sacct nor squeue knows (sacct failing, a job id from another cluster), or one that ended on a signal
    # while sacct still says it runs (nat_kd.launch.jobs)
    unknown_seconds: float = field(default=300.0, metadata={**POSITIVE, **most(86400, "a day: a lost job would "
                                                                                  "hold its step that long")})


# One cluster file serves both commands that submit jobs. What each kind of job asks for unless
# [resources.KIND] (or the study's [resources."STEP NAME"]) says otherwise, sized for the paper profile on one GPU
# a model job (docs/cluster.md, "What each job asks for" and "Expected GPU-hours of the paper profile")
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


# sbatch options that the typed keys make: a cluster file sets them through those keys only, so that the plan a
# dry run shows and the script agree (an sbatch table's option would silently win over the key: submitit writes
# its options last)
TYPED_OPTIONS = {"time": "hours", "t": "hours", "mem": "mem_gb", "cpus_per_task": "cpus", "c": "cpus",
                 "partition": "[launcher] partition", "p": "[launcher] partition", "account": "[launcher] account",
                 "A": "[launcher] account", "qos": "[launcher] qos", "constraint": "[launcher] constraint",
                 "C": "[launcher] constraint"}
# sbatch options that the commands set themselves for every job: the job's name and files, its array, its
# dependencies, the signal before the time limit (submitit's requeue)
OWN_OPTIONS = ("job_name", "J", "output", "o", "error", "e", "array", "a", "dependency", "d", "open_mode", "signal",
               "nodes", "N", "ntasks_per_node", "wckey", "kill_on_invalid_dep")
# in [resources.KIND] sbatch, a kind's own partition, account, qos or constraint is allowed (GPU jobs on a GPU
# partition): it is that kind's, over [launcher]'s for every job
PER_KIND_OPTIONS = ("partition", "p", "account", "A", "qos", "constraint", "C")


def _sbatch_table(options: dict, where: str, every_job: bool, resources: dict) -> dict:
    """An sbatch table checked: its values strings or finite numbers, no option that asks for GPUs, none that a
    typed key or the command itself sets. ``every_job``: [launcher] sbatch; ``resources``: the table's other keys,
    for the message."""
    options = _sbatch_options(options, where, every_job)
    for key, value in options.items():
        check_value(value, type(value) if isinstance(value, (str, bool)) else float, f"{where}.sbatch.{key}",
                    LaunchError)
        if key in OWN_OPTIONS:
            raise LaunchError(f"{where}.sbatch: {key} is set by the command for every job: drop it")
        if key in TYPED_OPTIONS and (every_job or key not in PER_KIND_OPTIONS):
            typed = TYPED_OPTIONS[key]
            has = f" (this table has {typed} = {resources[typed]!r})" if typed in resources else ""
            raise LaunchError(f"{where}.sbatch: {key} = {value!r} would silently override {typed}{has}: set "
                              f"{typed} instead")
    return options


def _table(cls, table: dict, where: str):
    """[launcher] or a [resources.X] table as ``cls``, every key known, typed, finite and in range."""
    settings = dataclass_from_table(cls, table, where, LaunchError)
    gpu_type = settings.gpu_type
    if gpu_type is not None and not _GPU_TYPE.fullmatch(gpu_type):
        raise LaunchError(f'{where}.gpu_type = {gpu_type!r}: a GPU type alone (e.g. "h100"); the count is gpus')
    return replace(settings, sbatch=_sbatch_table(settings.sbatch, where, cls is LauncherSettings, table))


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


def cluster_config(tables: dict, where: str = "") -> ClusterConfig:
    """``[launcher]`` and ``[resources.*]`` read and checked (``where``: the file, for the messages)."""
    prefix = f"{where}: " if where else ""
    try:
        for name, expected in (("launcher", "a table [launcher] of partition, account, max_jobs, ..."),
                               ("resources", "tables [resources.KIND] of gpus, cpus, mem_gb, hours, ...")):
            if not isinstance(tables.get(name, {}), dict):
                raise LaunchError(f"{name} = {tables[name]!r}: expected {expected}")
        launcher = _table(LauncherSettings, tables.get("launcher", {}), "[launcher]")
        resources = {}
        for key, table in tables.get("resources", {}).items():
            if not isinstance(table, dict):
                raise LaunchError(f"[resources].{key}: expected a table [resources.{key}] of gpus, cpus, mem_gb, "
                                  "hours, ...")
            resources[key] = {k: v for k, v in asdict(_table(Resources, table, f"[resources.{key}]")).items()
                              if k in table}
    except LaunchError as err:
        raise LaunchError(prefix + str(err)) from None
    return ClusterConfig(launcher, resources)


def read_cluster_file(path: str | Path) -> ClusterConfig:
    """A ``--cluster FILE.toml``: [launcher] and [resources.*] only."""
    path = Path(path)
    tables = read_toml(path, LaunchError)
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
