"""Deprecated path, kept until nat_kd.study imports ``fairseq_plugins.models.nat``: re-exports it."""
from .nat import STUDENT_ARCHS, STUDENT_FAMILIES, StudentFamily  # noqa: F401
