"""The input of a distillation: source token ids in the teacher's dictionary, the source text, the references.

Either raw text (encoded here into the teacher's tokens, tokenization.py) or a fairseq-binarized split. The
references are raw text, or else the binarized target side decoded to text the same way as the teacher's
output. Long sources are truncated to the teacher's maximum positions; empty sources are not decoded (an empty
target); both are recorded (1-based line numbers) rather than dropped, so the output always has one line per
input line.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from nat_kd.artifacts import BinarizedData
from nat_kd.corpus import CorpusError, read_lines


@dataclass
class DistillCorpus:
    """The corpus a teacher re-decodes (the input; the output is a nat_kd.artifacts.DistilledSet)."""

    source_tokens: list[torch.Tensor]  # each ends with EOS, at most the teacher's source positions long
    source_text: list[str]
    references: list[str] | None
    truncated_lines: list[int] = field(default_factory=list)  # 1-based
    empty_lines: list[int] = field(default_factory=list)  # 1-based
    source_description: dict = field(default_factory=dict)
    # tokens of each reference in the teacher's target dictionary, EOS included (fairseq's target sizes):
    # fairseq-generate batches by them too, so the batches, and with them the hypotheses, are its own
    reference_sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.source_tokens)

    def fingerprint(self) -> str:
        """A hash of what the decode depends on: the token ids (and references, used by seq-inter)."""
        digest = hashlib.sha256()
        sizes = np.array([len(t) for t in self.source_tokens], dtype=np.int64)
        digest.update(sizes.tobytes())
        digest.update(torch.cat(self.source_tokens).numpy().astype(np.int64).tobytes() if len(sizes) else b"")
        for line in self.references or []:
            digest.update(line.encode("utf-8") + b"\n")
        if self.reference_sizes is not None:
            digest.update(self.reference_sizes.astype(np.int64).tobytes())
        return digest.hexdigest()


def encode_text(lines: list[str], codec, dictionary) -> list[torch.Tensor]:
    """Raw lines -> the teacher's tokens -> ids in ``dictionary`` with EOS appended, as fairseq-preprocess does."""
    return [dictionary.encode_line(tokens, add_if_not_exist=False, append_eos=True).long()
            for tokens in codec.encode_all(lines)]


def token_strings(dictionary, tokens: list[torch.Tensor]) -> list[str]:
    """``[dictionary.string(t) for t in tokens]`` in one pass over all tokens at once.

    Dictionary.string walks each tensor element by element in Python; here the ids are gathered once, mapped
    through ``dictionary.symbols`` by numpy and only the joins stay per sentence. Same result: EOS and BOS are
    left out, as Dictionary.string does.
    """
    if not tokens:
        return []
    ids = torch.cat(tokens).numpy()
    drop = [dictionary.eos()] + ([dictionary.bos()] if hasattr(dictionary, "bos_index") else [])
    keep = ~np.isin(ids, drop)
    words = np.asarray(dictionary.symbols, dtype=object)[ids[keep]].tolist()
    # where each sentence's kept words end in ``words``
    sentence = np.repeat(np.arange(len(tokens)), [len(t) for t in tokens])
    ends = np.cumsum(np.bincount(sentence[keep], minlength=len(tokens))).tolist()
    return [" ".join(words[start:end]) for start, end in zip([0] + ends[:-1], ends)]


def _binarized(prefix: Path, dictionary):
    from fairseq.data import data_utils

    return data_utils.load_indexed_dataset(str(prefix), dictionary)


def load_binarized(data_dir: Path, split: str, lang: str, pair: str, dictionary) -> list[torch.Tensor]:
    """One side (``lang``) of a binarized split of language pair ``pair`` (SRC-TGT)."""
    prefix = BinarizedData(data_dir).prefix(split, *pair.split("-"), lang)
    dataset = _binarized(prefix, dictionary)
    if dataset is None:
        raise CorpusError(f"no binarized {split} data for {pair} in {data_dir} (looked for {prefix}.bin/.idx); "
                          "check --data and --split")
    return [dataset[i].long() for i in range(len(dataset))]


def _target_side(data_dir: str | None, split: str, teacher):
    """The binarized target side of ``split`` in ``data_dir`` (a fairseq dataset), or None if there is none."""
    if not data_dir:
        return None, None
    prefix = BinarizedData(data_dir).prefix(split, teacher.source_lang, teacher.target_lang, teacher.target_lang)
    return _binarized(prefix, teacher.tgt_dict), prefix


def reference_sizes(*, codec, target_side, references: list[str] | None) -> np.ndarray | None:
    """Each reference's length in target tokens, EOS included, as fairseq-preprocess would store it: from the
    binarized target side when there is one, else from the raw references through the teacher's encoders;
    None when there are no references (batches then follow the source alone)."""
    if target_side is not None:
        return np.asarray(target_side.sizes, dtype=np.int64)
    if references is None:
        return None
    return np.array([len(tokens.split()) + 1 for tokens in codec.encode_all(references)], dtype=np.int64)


def _check_count(what: str, path, count: int, expected: int, against: str) -> None:
    if count != expected:
        raise CorpusError(f"line-count mismatch: {what} {path} has {count} lines but {against} has {expected}; "
                          "they must be line-aligned")


def truncate(tokens: list[torch.Tensor], max_source: int, eos: int) -> list[int]:
    """Cut sources longer than ``max_source`` (EOS included) in place; returns their 1-based line numbers."""
    cut = []
    for i, t in enumerate(tokens):
        if len(t) > max_source:
            tokens[i] = torch.cat([t[: max_source - 1], t.new_tensor([eos])])
            cut.append(i + 1)
    return cut


def load_corpus(*, teacher, codecs, split: str, source: str | None = None, data_dir: str | None = None,
                reference: str | None = None) -> DistillCorpus:
    """The corpus from raw ``source`` text, or from binarized ``data_dir`` (``source`` then only gives the text).

    ``codecs``: the Tokenization of the source and of the target language. References: ``reference`` (raw
    text), else the binarized target side of ``data_dir``, decoded."""
    source_codec, target_codec = codecs
    src_dict, eos = teacher.src_dict, teacher.src_dict.eos()
    pair = f"{teacher.source_lang}-{teacher.target_lang}"
    description = {"split": split}
    text = read_lines(source) if source else None
    if data_dir:
        tokens = load_binarized(Path(data_dir), split, teacher.source_lang, pair, src_dict)
        description["binarized"] = str(Path(data_dir).resolve())
        if text is None:  # no raw text given: the source copy is the decoded binarized source
            text = source_codec.decode_all(token_strings(src_dict, tokens))
        else:
            _check_count("source", source, len(text), len(tokens), f"binarized {data_dir} ({split})")
    elif text is not None:
        tokens = encode_text(text, source_codec, src_dict)
    else:
        raise CorpusError("no corpus given: pass --source (raw text), --data (binarized) or --prepared")
    if source:
        description["source"] = str(Path(source).resolve())
    target_side, target_prefix = _target_side(data_dir, split, teacher)
    if target_side is not None:
        _check_count("binarized target", target_prefix, len(target_side), len(tokens), "the source")
    references = None
    if reference:
        references = read_lines(reference)
        _check_count("reference", reference, len(references), len(tokens), f"the source ({source or data_dir})")
        description["reference"] = str(Path(reference).resolve())
    elif target_side is not None:
        references = target_codec.decode_all(token_strings(teacher.tgt_dict, [target_side[i].long()
                                                                       for i in range(len(target_side))]))
        description["reference"] = f"{target_prefix}.bin (the binarized target side, decoded)"
    if not tokens:
        raise CorpusError(f"the source ({source or data_dir}) is empty: nothing to distil")
    empty = [i + 1 for i, t in enumerate(tokens) if len(t) <= 1]
    truncated = truncate(tokens, teacher.max_positions[0], eos)
    sizes = reference_sizes(codec=target_codec, target_side=target_side, references=references)
    return DistillCorpus(tokens, text, references, truncated, empty, description, sizes)


def source_token_lines(distilled, meta: dict) -> list:
    """The source side's token ids of a distilled set (``distilled``: a DistilledSet, ``meta``: its meta.json)
    as the teacher read them, one a line of the set's text: bin/'s, with an
    empty line where the set left the line out of bin/ (an empty source), so that a set made from it leaves
    the same lines out."""
    from fairseq.data import Dictionary

    split, src, tgt = meta["split"], meta["source_lang"], meta["target_lang"]
    src_dict = Dictionary.load(str(distilled.bin.dictionary(src)))
    left_out = set(meta.get("files", {}).get("binarized_left_out_lines", []))
    rows = iter(load_binarized(distilled.bin.root, split, src, f"{src}-{tgt}", src_dict))
    empty = src_dict.encode_line("", add_if_not_exist=False).long()
    return [empty if line in left_out else next(rows) for line in range(1, meta["sentences"] + 1)]
