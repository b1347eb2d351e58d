"""What runs a study's steps, and choose's pilots: the runner (a small make over fingerprinted steps), the step
functions, the model jobs as fairseq command lines, training with a learning curve, and the steps as cluster
jobs. It knows nothing of profiles or tables: the study (nat_kd.study) builds a plan of steps for it and reads
the records it leaves.

    runner.py        Runner: fingerprints, records (steps/NAME.json), local jobs side by side
    steps.py         the step functions (prepare, train, evaluate, distil, mix, analyse, time) and step names
    training.py      Training: fairseq-train's budget and optimiser settings
    curve.py         training in chunks with a validation-BLEU learning curve and early stopping
    fairseq_jobs.py  fairseq-train, fairseq-generate and the generator, each a job forked from one server
    job_server.py    the job server's one import: what every job inherits
    cluster.py       the steps as Slurm jobs through submitit (``--launcher slurm``)
"""
