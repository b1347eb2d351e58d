"""The distillation study of Zhou, Gu & Neubig (ICLR 2020) as one resumable command.

    python -m nat_kd.study cpu --out runs/study/cpu

config.py reads a profile (profiles/micro.toml, cpu.toml, paper.toml, or your own TOML); plan.py turns it
into steps, which nat_kd.engine runs (skipping what is done, redoing what changed; as Slurm jobs with
``--launcher slurm``); results.py writes the tables and figures (central_table.py, family_table.py, gains.py,
kd_methods.py, ladder.py); pilots.py measures how far short pilots agree with full training, for nat_kd.choose.
"""
