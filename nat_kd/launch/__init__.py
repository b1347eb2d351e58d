"""Running work as cluster jobs through submitit (the engine of fairseq's and Hydra's Slurm launchers).

The study driver (``nat_kd.study``) submits its steps and the generator (``nat_kd.generate_distilled``) its
shards through this package, which holds what the two share:

- ``settings``: the ``[launcher]`` and ``[resources.KIND]`` tables of a cluster file (one file serves both
  commands: each reads its own kinds and notes the other's), checked before anything is submitted;
- ``sbatch``: the submitit executor of a job, and the sbatch script a ``--dry-run`` prints;
- ``jobs``: a submitted job found again by a later run, its state read from the scheduler (sacct, then squeue
  where sacct does not know it), and how it ended: done, stopped from outside its work (resubmitted), or failed;
- ``signals``: SIGINT and SIGTERM in a driver (its jobs cancelled or left running, however many signals come)
  and in a job (a preemption's SIGTERM told from the job's own error);
- ``arguments``: the commands' shared options (--launcher, --cluster, --dry-run, --detach).

Launchers: ``local`` (the commands' own in-process runs: nothing here is used), ``slurm`` (sbatch), and
``submitit-local`` (submitit's LocalExecutor: each job a process on this machine, through the same code as
``slurm``; for trying a cluster set-up, and for the tests).
"""
