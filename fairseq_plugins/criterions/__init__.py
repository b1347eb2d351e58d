"""Criteria: word-level knowledge distillation, ``word_kd`` (AT students) and ``nat_word_kd`` (NAT students);
``multi_reference_nat_loss`` (NAT students on several references a sentence)."""
from . import multi_reference, nat_word_kd, word_kd  # noqa: F401
