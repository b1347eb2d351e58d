"""The toolkit's own errors: one base class.

A ``NatKdError`` is bad input, settings or state, never a bug: its message names the file (and line) and
the fix. Command lines print it as one line and exit with status 2 (``nat_kd.cli``); any other exception
is a bug and keeps its traceback. The fairseq plugin's ``TeacherError`` is treated the same way; it cannot
derive from this class because the plugin does not import nat_kd.
"""


class NatKdError(ValueError):
    """Bad input, settings or state: the message names the file and the fix."""


class SettingsError(NatKdError):
    """Options that are out of range, do not fit together, or would overwrite something else."""
