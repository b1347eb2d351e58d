"""The analysis metrics: each a small class whose score object carries the signature of its settings."""
from nat_kd.analysis.metrics.base import AlignedCorpus, Signature, align_corpus
from nat_kd.analysis.metrics.complexity import Complexity, ComplexityScore
from nat_kd.analysis.metrics.faithfulness import DEFAULT_FLOOR, Faithfulness, FaithfulnessScore
from nat_kd.analysis.metrics.modes import Modes, ModesScore, UnigramModels
from nat_kd.analysis.metrics.reordering import Reordering, ReorderingScore

__all__ = ["AlignedCorpus", "Signature", "align_corpus", "Complexity", "ComplexityScore", "Faithfulness",
           "FaithfulnessScore", "DEFAULT_FLOOR", "Modes", "ModesScore", "UnigramModels", "Reordering",
           "ReorderingScore"]
