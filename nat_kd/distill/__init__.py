"""The generator: re-decode a corpus with a teacher into a distilled training set (sequence-level KD).

Its modules, in the order a run uses them:

    config                  DistillConfig: every setting of a run, plain values
    teachers                published teachers' folders (CTranslate2, Hugging Face) as the generator's teacher
    source                  the input: the corpus to distil (DistillCorpus), raw text or fairseq-binarized
    decoding                the strategies (beam, greedy, sampling, topk, topp, seq-inter): fairseq searches
    backends                what decodes a batch: the contract (base.py), the registry, fairseq and ctranslate2
    progress                the chunk plan and the chunks saved so far (resume, shards)
    autobatch               --max-tokens auto: the fairseq backend's batches sized to the GPU's memory
    session                 what a process loads once (teacher, corpus, batches), the run's fingerprint
    chunk_decoder           a chunk decoded by the backend, one hypothesis kept per sentence, detokenized, scored
    pool                    the device, the processes and threads, and the loop over the pending chunks
    transformers_reference  transformers' own generate, the reference --check-against-transformers decodes with
    agreement               --check-against-fairseq/-transformers: the backend against a reference
    scores                  BLEU/chrF against the references, summed chunk by chunk
    student_vocabulary      --student-data: bin/ re-encoded into the student's tokens
    output                  the distilled set on disk (nat_kd.artifacts.DistilledSet)
    pipeline                distill(DistillConfig) -> DistillResult: all of the above in order
    cluster                 --launcher slurm: the shards as a job array
    __main__                the command line (also ``python -m nat_kd.generate_distilled``)
"""
__all__ = ["DistillConfig", "DistillResult", "distill"]


def __getattr__(name: str):
    # imported on first use, not with the package: they import fairseq, which logs as it loads, and
    # ``python -m nat_kd.distill`` sets up logging (nat_kd.cli) before that
    if name == "DistillConfig":
        from .config import DistillConfig

        return DistillConfig
    if name in ("DistillResult", "distill"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
