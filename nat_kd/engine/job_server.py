"""The job server's one import (fairseq_jobs' forkserver preload): what every job forked from it inherits.

- fairseq.tasks.text_to_speech logs "Please install tensorboardX" at INFO as it is imported, which the server
  would print on the driver's terminal. Only that logger is quietened, before fairseq is imported: the jobs keep
  fairseq's INFO lines (training progress, speed) in their step logs, where the study reads them.
- Then what the jobs run (fairseq_jobs.JOB_MODULES), and what they would each import on the way: torch._dynamo
  (by the first optimizer a job builds) and matplotlib (by a distilled set's card). A job may run any other
  module: it imports that itself.
- Last, fairseq-train and fairseq-generate's conversion of a command line into a hydra config, once of each
  kind. A process's first conversion builds the lexer tables of hydra's override grammar (ANTLR caches them in
  the process), much of a micro model's job. Each conversion also looks up the module of every frame on its
  stack (``inspect.stack``), which maps every imported module's file once per process and again for each
  module imported since: done after all the imports, that map is whole, and no job builds it again.
"""
import importlib
import logging
import warnings

logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

import fairseq_plugins  # noqa: E402,F401 - after the logger's level
from fairseq import options  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

from nat_kd.engine.fairseq_jobs import JOB_MODULES  # noqa: E402

for _module in (*JOB_MODULES, "torch._dynamo", "nat_kd.analysis.plotting"):
    importlib.import_module(_module)


def _convert_once_of_each_kind() -> None:
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


_convert_once_of_each_kind()
