"""A stand-in Slurm for the tests: sbatch, sacct, squeue, scancel and srun as small programs on PATH, over one folder.

Two modes:
- bookkeeping (``run=False``): sbatch keeps each script and answers a new job id; sacct answers the states a test
  sets (PENDING for the others); squeue lists the queued and running ones; scancel makes a job CANCELLED.
- running (``run=True``): sbatch also starts each job (each task of an array) as Slurm does, with the SLURM_*
  variables submitit reads, in a process group of its own under a supervisor that records RUNNING, then
  COMPLETED or FAILED by the job's exit status; srun runs the command with its --output and --error. A
  preemption (``preempt``), like scancel, does what Slurm does: the state first, then SIGTERM to every process of
  the job, then SIGKILL after a grace time.

sacct can be made to fail (``accounting(False)``) as it does where accounting storage is disabled, at any time
(also after it has answered), and squeue as it does when the controller is unreachable (``queue(False)``); each
call of either is logged with its time. sbatch can be held (``hold_sbatch``) after it has queued a job and before
it prints the id, as a slow controller's reply is: a signal then reaches it mid-submission; or it can fail after
queuing the job (``lose_replies``), as when the controller's reply times out. scontrol requeue puts
a running job back (submitit's requeue near the time limit), and ``time_limit`` sends what Slurm sends before it:
SIGUSR2 to the job's step (srun's process), not to its batch script.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

_LOCKED_STATES = """
import fcntl, json, os, pathlib

def write(path, text):
    # whole or not at all: the stand-in's programs read these files while others write them, as Slurm's
    # own records are never seen half-written
    path = pathlib.Path(path)
    temporary = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    temporary.write_text(text)
    os.replace(temporary, path)

def update(folder, **states):
    folder = pathlib.Path(folder)
    with open(folder / "states.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = folder / "states.json"
        known = json.loads(path.read_text()) if path.is_file() else {}
        ends = ("CANCELLED", "PREEMPTED", "NODE_FAIL", "TIMEOUT")
        # an end the scheduler gave (cancelled, preempted) is not overwritten by the exit status that follows it
        kept = {k: v for k, v in states.items() if not (k in known and known[k].split()[0] in ends
                                                       and v in ("COMPLETED", "FAILED"))}
        write(path, json.dumps({**known, **kept}))

def read(folder):
    path = pathlib.Path(folder) / "states.json"
    return json.loads(path.read_text()) if path.is_file() else {}
"""

_SBATCH = """
import fcntl, itertools, os, pathlib, re, subprocess, sys, time
folder = pathlib.Path({folder!r})
sys.path.insert(0, str(folder))
import states
script = pathlib.Path(sys.argv[-1]).read_text()
refused = (folder / "refused.txt").read_text().split() if (folder / "refused.txt").is_file() else []
if any(f"--job-name=nat_kd.{{name}}." in script for name in refused):
    sys.exit("sbatch: error: Batch job submission failed: Invalid account or account/partition combination")
with open(folder / "ids.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    n = len(list(folder.glob("job-*.sh"))) + {first_id}
    states.write(folder / f"job-{{n}}.sh", script)
array = re.search(r"^#SBATCH --array=0-(\\d+)", script, re.M)
tasks = [f"{{n}}_{{k}}" for k in range(int(array.group(1)) + 1)] if array else [str(n)]
if {run}:
    states.update(folder, **{{task: "PENDING" for task in tasks}})
    for task in tasks:
        subprocess.Popen([sys.executable, str(folder / "supervisor.py"), task, sys.argv[-1]], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if (folder / "lose-reply").exists():  # queued, and the reply lost on its way
    sys.exit("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")
if (folder / "hold-sbatch").exists():  # queued; the reply is slow to come
    states.write(folder / f"sbatch-held-{{n}}", "")
    deadline = time.time() + 60
    while not (folder / "release-sbatch").exists() and time.time() < deadline:
        time.sleep(0.02)
print(f"Submitted batch job {{n}}")
"""

_SUPERVISOR = """
import os, pathlib, signal, subprocess, sys
folder = pathlib.Path({folder!r})
sys.path.insert(0, str(folder))
import states
task, script = sys.argv[1], sys.argv[2]
job, _, index = task.partition("_")
env = dict(os.environ, SLURM_JOB_ID=str(int(job) * 100 + int(index or 0)) if index else job, SLURM_NTASKS="1",
           SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1",
           STAND_IN_JOB=task)
if index:
    env.update(SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=index)
requeue = folder / f"requeue-{{task}}"
while True:
    job_process = subprocess.Popen(["bash", script], env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    states.write(folder / f"pgid-{{task}}", str(job_process.pid))
    states.update(folder, **{{task: "RUNNING"}})
    code = job_process.wait()
    if not requeue.exists():
        break
    requeue.unlink()  # scontrol requeue: the same job runs again, under the same id
    env["SLURM_RESTART_COUNT"] = str(int(env.get("SLURM_RESTART_COUNT", "0")) + 1)
states.write(folder / f"exit-{{task}}", str(code))
states.update(folder, **{{task: "COMPLETED" if code == 0 else "FAILED"}})
"""

_SCONTROL = """
import pathlib, sys
folder = pathlib.Path({folder!r})
sys.path.insert(0, str(folder))
import states
if sys.argv[1:2] != ["requeue"]:
    sys.exit(f"scontrol: the stand-in knows requeue only, not {{sys.argv[1:]}}")
task = sys.argv[2]
states.write(folder / f"requeue-{{task}}", "")
states.update(folder, **{{task: "REQUEUED"}})
"""

_SRUN = """
import os, sys
args, output, error = sys.argv[1:], None, None
while args and args[0].startswith("--"):
    flag = args.pop(0)
    if flag in ("--output", "--error"):
        value = args.pop(0)
        task = os.environ.get("STAND_IN_JOB", "0")
        job, _, index = task.partition("_")
        value = (value.replace("%A", job).replace("%a", index).replace("%j", os.environ["SLURM_JOB_ID"])
                 .replace("%t", "0"))
        output, error = (value, error) if flag == "--output" else (output, value)
for stream, path in ((1, output), (2, error)):
    if path:
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), stream)
# the job's step: what Slurm signals before the time limit
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"step-{os.environ.get('STAND_IN_JOB', '0')}"),
          "w") as step:
    step.write(str(os.getpid()))
os.execvp(args[0], args)
"""

_SACCT = """
import pathlib, sys, time
folder = pathlib.Path({folder!r})
sys.path.insert(0, str(folder))
import states
with open(folder / "sacct-calls.txt", "a") as calls:
    calls.write(f"{{time.time()}}\\n")
if (folder / "accounting-off").exists():
    sys.exit("sacct: error: Slurm accounting storage is disabled")
known = states.read(folder)
submitted = {{p.stem.removeprefix("job-") for p in folder.glob("job-*.sh")}}
ids = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "-j"]
print("JobID|State|NodeList")
for i in ids:  # an array's id stands for its tasks, as in sacct; an id it never had, nothing
    tasks = [k for k in known if k.startswith(i + "_")] or ([i] if i in known or i in submitted else [])
    for task in tasks:
        print(f"{{task}}|{{known.get(task, 'PENDING')}}|node1")
"""

_SQUEUE = """
import pathlib, re, sys, time
folder = pathlib.Path({folder!r})
sys.path.insert(0, str(folder))
import states
with open(folder / "squeue-calls.txt", "a") as calls:
    calls.write(f"{{time.time()}}\\n")
if (folder / "queue-off").exists():
    sys.exit("squeue: error: Unable to contact slurm controller (connect failure)")
known = states.read(folder)
scripts = {{p.stem.removeprefix("job-"): p.read_text() for p in folder.glob("job-*.sh")}}
queued = ("PENDING", "RUNNING", "COMPLETING", "REQUEUED")
if "--name" in sys.argv:  # the queued jobs of that name: an array as its tasks
    name = sys.argv[sys.argv.index("--name") + 1]
    for job, script in sorted(scripts.items()):
        if f"--job-name={{name}}\\n" in script:
            tasks = [k for k in known if k.startswith(job + "_")] or [job]
            for task in tasks:
                if known.get(task, "PENDING") in queued:
                    print(task)
    sys.exit(0)
wanted = sys.argv[sys.argv.index("--jobs") + 1]
state = known.get(wanted, "PENDING" if wanted in scripts else None)
if state not in queued:
    sys.exit("slurm_load_jobs error: Invalid job id specified")
print(state)
"""

_SCANCEL = """
import pathlib, subprocess, sys
folder = pathlib.Path({folder!r})
sys.path.insert(0, str(folder))
import states
with open(folder / "cancelled.txt", "a") as cancelled:
    cancelled.write(sys.argv[-1] + "\\n")
states.update(folder, **{{sys.argv[-1]: "CANCELLED by 0"}})
subprocess.Popen([sys.executable, str(folder / "kill.py"), sys.argv[-1]], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""

_KILL = """
import os, pathlib, signal, sys, time
folder = pathlib.Path({folder!r})
task = sys.argv[1]
files = [folder / f"pgid-{{task}}"] if (folder / f"pgid-{{task}}").is_file() else folder.glob(f"pgid-{{task}}_*")
groups = [int(f.read_text()) for f in files]
for sig, pause in ((signal.SIGTERM, {grace}), (signal.SIGKILL, 0)):
    for group in groups:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass
    time.sleep(pause)
"""


def _write(path: Path, text: str) -> None:
    """The stand-in's states.write, for the test's side."""
    temporary = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    temporary.write_text(text)
    os.replace(temporary, path)


class SlurmStandIn:
    def __init__(self, folder: Path, monkeypatch, first_id: int, run: bool = False, grace: float = 2.0):
        self.folder, self.grace = Path(folder), grace
        self.folder.mkdir()
        (self.folder / "states.py").write_text(_LOCKED_STATES)
        programs = {"sbatch": _SBATCH.format(folder=str(folder), first_id=first_id, run=run),
                    "supervisor.py": _SUPERVISOR.format(folder=str(folder)), "srun": _SRUN,
                    "sacct": _SACCT.format(folder=str(folder)), "squeue": _SQUEUE.format(folder=str(folder)),
                    "scancel": _SCANCEL.format(folder=str(folder)), "scontrol": _SCONTROL.format(folder=str(folder)),
                    "kill.py": _KILL.format(folder=str(folder), grace=grace)}
        for name, body in programs.items():
            path = self.folder / name
            path.write_text(f"#!{sys.executable}\n{body}")
            path.chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    def set_states(self, **states) -> None:
        """sacct answers these states from now on (job id -> state)."""
        import fcntl

        with open(self.folder / "states.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.folder / "states.json"
            known = json.loads(path.read_text()) if path.is_file() else {}
            _write(path, json.dumps({**known, **states}))

    def states(self) -> dict:
        path = self.folder / "states.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def refuse(self, *names: str) -> None:
        """sbatch refuses the jobs of these steps from now on."""
        _write(self.folder / "refused.txt", " ".join(names))

    def accounting(self, on: bool) -> None:
        """sacct works, or fails as where accounting storage is disabled."""
        (self.folder / "accounting-off").unlink(missing_ok=True) if on else (self.folder / "accounting-off").touch()

    def queue(self, on: bool) -> None:
        """squeue works, or fails as when the controller is unreachable."""
        (self.folder / "queue-off").unlink(missing_ok=True) if on else (self.folder / "queue-off").touch()

    def calls(self, program: str) -> list[float]:
        """When sacct or squeue was called, in order."""
        path = self.folder / f"{program}-calls.txt"
        return [float(t) for t in path.read_text().split()] if path.is_file() else []

    def hold_sbatch(self, on: bool) -> None:
        """sbatch, once it has queued a job, waits to print its id until ``release_sbatch``."""
        (self.folder / "release-sbatch").unlink(missing_ok=True)
        (self.folder / "hold-sbatch").touch() if on else (self.folder / "hold-sbatch").unlink(missing_ok=True)

    def held(self) -> list[str]:
        """The jobs queued by an sbatch that is held (or was), by id."""
        return sorted(p.name.removeprefix("sbatch-held-") for p in self.folder.glob("sbatch-held-*"))

    def release_sbatch(self) -> None:
        (self.folder / "release-sbatch").touch()

    def lose_replies(self, on: bool) -> None:
        """sbatch queues the job, then fails as when its reply times out (the job is queued all the same)."""
        (self.folder / "lose-reply").touch() if on else (self.folder / "lose-reply").unlink(missing_ok=True)

    def time_limit(self, task: str) -> None:
        """What Slurm sends a job near its time limit (submitit's --signal=USR2@90): SIGUSR2 to its step."""
        os.kill(int((self.folder / f"step-{task}").read_text()), signal.SIGUSR2)

    def cancelled(self) -> list[str]:
        path = self.folder / "cancelled.txt"
        return path.read_text().split() if path.is_file() else []

    def jobs(self) -> dict:
        """Job id -> its sbatch script's name (the step or the set, without the run's part) and dependency."""
        out = {}
        for script in self.folder.glob("job-*.sh"):
            text = script.read_text()
            name = text.split("--job-name=nat_kd.", 1)[1].split("\n", 1)[0].rsplit(".", 1)[0]  # without the run's
            dependency = text.split("--dependency=", 1)[1].split("\n", 1)[0] if "--dependency=" in text else None
            out[script.stem.removeprefix("job-")] = (name, dependency)
        return out

    def running(self, task: str) -> bool:
        """Whether a running job (task) still has a process."""
        pgid = self.folder / f"pgid-{task}"
        if not pgid.is_file():
            return False
        try:
            os.killpg(int(pgid.read_text()), 0)
        except ProcessLookupError:
            return False
        return True

    def preempt(self, task: str) -> None:
        """What Slurm does to a job it preempts (where preemption cancels): PREEMPTED, then SIGTERM to every
        process of the job, SIGKILL after the grace time; returns once the job has no process left."""
        self.set_states(**{task: "PREEMPTED"})
        group = int((self.folder / f"pgid-{task}").read_text())
        for sig, pause in ((signal.SIGTERM, self.grace), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                return
            deadline = time.time() + pause
            while time.time() < deadline and self.running(task):
                time.sleep(0.05)
        deadline = time.time() + 30
        while self.running(task) and time.time() < deadline:
            time.sleep(0.05)
