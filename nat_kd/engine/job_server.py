"""The job server's first import (fairseq_jobs' forkserver preload): what every job forked from it inherits.

- fairseq.tasks.text_to_speech logs "Please install tensorboardX" at INFO as it is imported, which the server
  would print on the driver's terminal. Only that logger is quietened, before fairseq is imported: the jobs keep
  fairseq's INFO lines (training progress, speed) in their step logs, where the study reads them.
- fairseq-train and fairseq-generate turn their command line into a hydra config. A process's first such
  conversion builds the lexer tables of hydra's override grammar (ANTLR caches them in the process), much
  of a micro model's job. The server converts one command line of each kind, so that every job starts with
  those tables built.
"""
import logging
import warnings

logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

from fairseq import options  # noqa: E402 - after the logger's level
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402


def _build_hydras_tables() -> None:
    commands = ((options.get_training_parser(), ["-", "--task", "translation", "--arch", "transformer"]),
                (options.get_generation_parser(), ["-", "--task", "translation", "--path", "-"]))
    # hydra's composing also configures logging (the root logger at DEBUG, on stderr) and logs: in a job that is
    # its own log's business, in the server it would be the driver's terminal. Silent here, logging left as it was.
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():  # hydra's deprecation notes, which each job's log still gets
            warnings.simplefilter("ignore")
            for parser, args in commands:
                convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=args))
    finally:
        logging.disable(logging.NOTSET)
        root.handlers[:] = handlers
        root.setLevel(level)


_build_hydras_tables()
