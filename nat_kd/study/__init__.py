"""The distillation study of Zhou, Gu & Neubig (ICLR 2020) as one resumable command.

    python -m nat_kd.study cpu --out runs/study/cpu

config.py reads a profile (profiles/micro.toml, cpu.toml, paper.toml, or your own TOML); plan.py turns it
into steps; steps.py runs them (skipping what is done, redoing what changed); fairseq_jobs.py holds the
training/decoding command lines; results.py writes the tables and figures; cluster.py submits the steps as
Slurm jobs (``--launcher slurm``).
"""
