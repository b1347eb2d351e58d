"""Build any registered architecture on a vocabulary of a given size, without data, to count parameters.

Outside models/: fairseq imports every module there as a model definition (--user-dir), and this is a tool.
"""
import argparse
from types import SimpleNamespace

from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


def dictionary_of_size(size: int) -> Dictionary:
    """A fairseq dictionary with exactly ``size`` entries, the four special symbols included."""
    dictionary = Dictionary()
    for i in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def build_model(arch: str, vocab_size: int, **overrides):
    """Instantiate ``arch`` as fairseq-train would, with one joined dictionary of ``vocab_size`` entries."""
    args = argparse.Namespace(arch=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    dictionary = dictionary_of_size(vocab_size)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)


def count_parameters(arch: str, vocab_size: int) -> int:
    return sum(p.numel() for p in build_model(arch, vocab_size).parameters())
