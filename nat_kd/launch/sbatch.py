"""A job's submitit executor, and the sbatch script a ``--dry-run`` prints (made without Slurm by submitit's own
renderer, from the same parameters)."""
from __future__ import annotations

import hashlib
import shlex
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

from .settings import LaunchError, LauncherSettings, Resources
from .signals import signals_held

# submitit's own names for the two cluster launchers (``debug`` runs jobs in the driver: the tests use it)
SUBMITIT_CLUSTER = {"slurm": "slurm", "submitit-local": "local", "debug": "debug"}


def job_name(what: str, run: Path) -> str:
    """A job's Slurm name: ``what`` (a study step, a set's shards or merge) and 8 hex digits of the run's folder,
    so that the name is unique to the run and the step: a driver that lost a job's id finds the job by its name
    in squeue (jobs.queued_by_name) instead of submitting another."""
    return f"nat_kd.{what}.{hashlib.sha256(str(Path(run).resolve()).encode()).hexdigest()[:8]}"


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
        executor = submitit.AutoExecutor(folder=folder, cluster=SUBMITIT_CLUSTER[launcher])
    except RuntimeError as err:  # no srun on this machine
        raise LaunchError(f"--launcher {launcher}: {err} (try --dry-run to see the jobs)") from None
    executor.update_parameters(**executor_parameters(resources, settings, name, after))
    return executor


@contextmanager
def submission(launcher: str):
    """Around a submission: the scheduler's refusal (sbatch's own message: a time limit above the partition's,
    an unknown account) raised as a LaunchError, on one line. On Slurm, sbatch starts with SIGINT and SIGTERM
    held (``signals_held``): a signal to the driver's whole process group (Ctrl-C in its terminal) would
    otherwise kill an sbatch that has queued the job but not yet printed its id, and the driver would never
    learn of it. (A submitit-local job is a child of the driver, which cancels it by SIGINT: not held there.)"""
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    try:
        with signals_held() if launcher == "slurm" else nullcontext():
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
