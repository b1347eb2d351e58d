"""Word-level knowledge distillation criteria: ``word_kd`` (AT students) and ``nat_word_kd`` (NAT students)."""
from . import nat_word_kd, word_kd  # noqa: F401
