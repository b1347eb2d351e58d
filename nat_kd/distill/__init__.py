"""The generator: re-decode a corpus with a teacher into a distilled training set (sequence-level KD).

    config    DistillConfig: every setting of a run, plain values
    source    the input: the corpus to distil (DistillCorpus), raw text or fairseq-binarized
    decoding  the strategies (beam, greedy, sampling, topk, topp, seq-inter) on fairseq's SequenceGenerator
    progress  the chunk plan and the chunks saved so far (resume, shards)
    backends  what decodes a batch (fairseq, ctranslate2), given plain settings and the loaded teacher
    workers   the decoding processes
    scores    BLEU/chrF against the references, summed chunk by chunk
    output    the distilled set on disk (nat_kd.artifacts.DistilledSet)
    pipeline  distill(DistillConfig) -> DistillResult: all of the above in order
    __main__  the command line (also ``python -m nat_kd.generate_distilled``)
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
