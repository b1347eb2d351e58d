"""The generator: re-decode a corpus with a teacher into a distilled training set (sequence-level KD).

    source    the input: the corpus to distil (DistillCorpus), raw text or fairseq-binarized
    decoding  the strategies (beam, greedy, sampling, topk, topp, seq-inter) on fairseq's SequenceGenerator
    progress  the chunk plan and the chunks saved so far (resume, shards)
    workers   the decoding processes
    scores    BLEU/chrF against the references, summed chunk by chunk
    output    the distilled set on disk (nat_kd.artifacts.DistilledSet)
    pipeline  distill(DistillConfig) -> DistillResult: all of the above in order
    __main__  the command line (also ``python -m nat_kd.generate_distilled``)
"""
from .pipeline import DistillConfig, DistillResult, distill

__all__ = ["DistillConfig", "DistillResult", "distill"]
