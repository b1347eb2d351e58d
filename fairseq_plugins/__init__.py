"""nat-kd's fairseq plugins: load with ``fairseq-train --user-dir fairseq_plugins`` (or import this package).

Importing registers the AT teacher and NAT student architectures and makes fairseq's own checkpoint
loading work under torch >= 2.6 without opening it to arbitrary pickles (see checkpoint_safety).
"""
from . import checkpoint_safety  # noqa: F401  (must run before any checkpoint is loaded)
from .models import students, teachers  # noqa: F401
from . import criterions  # noqa: F401
