"""Autoregressive transformers ``kd_transformer_{tiny,small,base,big}`` on fairseq's ``transformer``.

The study's AT teachers, and also its AT students (word-level KD, Born-Again rounds): one family, four sizes.
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import base_architecture

from .sizes import SIZES, sized_architecture

TRANSFORMER_ARCHS = {}
for _name, _size in SIZES.items():
    _arch = f"kd_transformer_{_name}"
    register_model_architecture("transformer", _arch)(sized_architecture(_size, base_architecture))
    TRANSFORMER_ARCHS[_arch] = _size
