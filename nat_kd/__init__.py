"""nat-kd: sequence-level knowledge distillation for non-autoregressive machine translation."""

__version__ = "0.1.0"
