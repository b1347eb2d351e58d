"""nat-kd's fairseq plugins: load with ``fairseq-train --user-dir fairseq_plugins`` (or import this package).

Importing registers the transformer and NAT architectures and the word-KD criteria, and makes fairseq's own
checkpoint loading work under torch >= 2.6 without opening it to arbitrary pickles (see checkpoint_safety).
The plugin stands alone: it never imports nat_kd (nat_kd uses it, not the other way round).
"""
from . import checkpoint_safety  # noqa: F401  (must run before any checkpoint is loaded)
from .models import nat, transformer  # noqa: F401
from . import criterions, tasks  # noqa: F401
