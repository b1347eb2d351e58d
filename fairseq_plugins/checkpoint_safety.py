"""Let fairseq's checkpoints load under torch >= 2.6 while keeping ``weights_only=True``.

torch >= 2.6 unpickles checkpoints with ``weights_only=True`` by default, which accepts tensors and plain
containers only. fairseq checkpoints also hold the training configuration as an ``argparse.Namespace``, so
every fairseq loader (training resumption, fairseq-generate, our tools: all go through
``fairseq.checkpoint_utils.load_checkpoint_to_cpu``) fails. Setting ``weights_only=False`` would let any
file execute arbitrary code when loaded; instead we add the few plain data classes fairseq writes to
torch's allow-list. Anything else in a pickle is still refused by torch.

This runs when the plugin package is imported: by ``--user-dir fairseq_plugins`` for fairseq's command
line tools, and by every nat_kd tool that loads a model.
"""
import argparse

import torch.serialization

# Exactly what fairseq 0.12 puts in a checkpoint besides tensors and builtins (found with
# torch.serialization.get_unsafe_globals_in_checkpoint on teacher and student checkpoints).
FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace]

torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
