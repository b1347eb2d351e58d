"""The distilled corpus's source pieces, written in bulk, against fairseq's own code."""
from pathlib import Path

import torch
from fairseq.data import Dictionary

from nat_kd.distill_corpus import load_binarized, token_strings


def real_tokens(tiny_en_de: Path, dictionary: Dictionary) -> list[torch.Tensor]:
    """The binarized valid source, plus an <unk> inside a sentence and an empty (EOS-only) source."""
    tokens = load_binarized(tiny_en_de / "bin", "valid", "en", "en-de", dictionary)
    unk = torch.cat([tokens[0][:2], torch.tensor([dictionary.unk()]), tokens[0][2:]])
    return tokens + [unk, torch.tensor([dictionary.eos()])]


def test_token_strings_equal_dictionary_string(tiny_en_de):
    dictionary = Dictionary.load(str(tiny_en_de / "bin" / "dict.en.txt"))
    tokens = real_tokens(tiny_en_de, dictionary)
    strings = token_strings(dictionary, tokens)
    assert strings == [dictionary.string(t) for t in tokens]
    assert "<unk>" in strings[-2].split() and strings[-1] == ""

