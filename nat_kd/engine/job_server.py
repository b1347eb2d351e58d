"""The job server's first import (fairseq_jobs' forkserver preload, before fairseq): fairseq.tasks.text_to_speech
logs "Please install tensorboardX" at INFO as it is imported, which the server would print on the driver's
terminal. Only that logger is quietened: the jobs forked from the server keep fairseq's INFO lines (training
progress, speed) in their step logs, where the study reads them."""
import logging

logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
