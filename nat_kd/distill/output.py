"""Write the distilled set: text, sentencepiece pieces, a fairseq-binarized copy, meta.json; atomically."""
from __future__ import annotations

import shutil
from pathlib import Path

from nat_kd import atomic
from nat_kd.analysis.card import build_card, write_card
from nat_kd.analysis.metrics.sentence import SentenceScores
from nat_kd.artifacts import BinarizedData, DistilledSet


def _lines(lines) -> str:
    return "".join(line + "\n" for line in lines)


def write_indexed(prefix: Path, dictionary, items) -> None:
    """``prefix``.bin/.idx with fairseq's own mmap writer, exactly as fairseq-preprocess writes a split."""
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(indexed_dataset.data_file_path(str(prefix)), impl="mmap",
                                           vocab_size=len(dictionary))
    for item in items:
        builder.add_item(item)
    builder.finalize(indexed_dataset.index_file_path(str(prefix)))


def lookup(dictionary, lines: list[str]) -> tuple[list, int, int]:
    """Each line's tokens as ids of ``dictionary``, as Dictionary.encode_line does (fairseq's whitespace split,
    unknown tokens to <unk>, EOS appended) without its element-by-element tensor writes; and the number of
    tokens (EOS left out) and of those that became <unk> (fairseq-preprocess's "replaced")."""
    import numpy as np
    import torch
    from fairseq.tokenizer import tokenize_line

    indices, unk, eos = dictionary.indices, dictionary.unk(), dictionary.eos()
    ids = [np.array([indices.get(word, unk) for word in tokenize_line(line)] + [eos], dtype=np.int32)
           for line in lines]
    every = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    tokens = len(every) - len(ids)
    replaced = int((every == unk).sum()) - sum(line.split().count(dictionary.unk_word) for line in lines)
    return [torch.from_numpy(i) for i in ids], tokens, replaced


def binarize(bin_dir: Path, split: str, src: str, tgt: str, dict_dir: Path, source_tokens: list | None,
             target_pieces: list[str], source_pieces: list[str] | None = None) -> dict:
    """The binarized split with the dictionaries of ``dict_dir`` (the teacher's, or the student's): byte for
    byte what fairseq-preprocess writes from the pieces files, built from what we hold instead of re-reading
    and re-encoding them. The source side is the token ids the teacher read (``source_tokens``: spm/ spells
    exactly these: no EOS or BOS inside a sentence), or ``source_pieces`` looked up like the target pieces
    (``lookup``). Returns each side's token and <unk> counts."""
    from fairseq.data import Dictionary

    out, data = BinarizedData(bin_dir), BinarizedData(dict_dir)
    out.root.mkdir()
    src_dict, tgt_dict = (Dictionary.load(str(data.dictionary(lang))) for lang in (src, tgt))
    for lang, dictionary in ((src, src_dict), (tgt, tgt_dict)):
        dictionary.save(str(out.dictionary(lang)))  # as fairseq-preprocess saves them
    counts = {}
    if source_pieces is not None:
        source_tokens, *counts["source"] = lookup(src_dict, source_pieces)
    write_indexed(out.prefix(split, src, tgt, src), src_dict, source_tokens)
    target_ids, *counts["target"] = lookup(tgt_dict, target_pieces)
    write_indexed(out.prefix(split, src, tgt, tgt), tgt_dict, target_ids)
    return {side: {"tokens": tokens, "unk": replaced, "unk_share": round(replaced / max(1, tokens), 6)}
            for side, (tokens, replaced) in counts.items()}


def copy_other_splits(data_dir: Path | None, bin_dir: Path, split: str, src: str, tgt: str) -> list[str]:
    """The original data's other splits (valid, test: real references) beside the distilled one, so that
    fairseq-train can validate on them at once; returns their names."""
    if data_dir is None:
        return []
    copied = set()
    for file in BinarizedData(data_dir).split_files(src, tgt):
        name = BinarizedData.split_of(file)
        if name != split:
            shutil.copyfile(file, Path(bin_dir) / file.name)
            copied.add(name)
    return sorted(copied)


def write_output(out_dir: Path, *, split: str, src: str, tgt: str, source_text: list[str],
                 source_tokens: list, source_pieces: list[str], target_pieces: list[str], target_text: list[str],
                 dict_dir: Path, meta: dict, data_dir: Path | None = None, bin_left_out: list[int] = (),
                 references: list[str] | None = None, sentence_scores: SentenceScores | None = None,
                 student_pieces: tuple[list[str], list[str]] | None = None) -> None:
    """The whole set in a temporary folder renamed into place: texts and pieces with every line, bin/ with all
    but the ``bin_left_out`` lines (1-based: pairs that would only add noise to a training set, such as empty
    sources), meta.json, and each line's scores with the dataset card when ``sentence_scores`` are given.

    ``student_pieces`` (source, target: the texts in the student's tokens): bin/ holds them, with the
    dictionaries of ``dict_dir`` (the student's), and meta.json's ``student_vocabulary`` their <unk> counts."""
    if not (len(source_text) == len(source_pieces) == len(target_pieces) == len(target_text)):
        raise AssertionError("distilled output is not line-aligned with the source; this is a bug")
    with atomic.building_directory(out_dir) as work:
        distilled = DistilledSet(work)
        distilled.pieces_dir.mkdir()
        for lang, text, pieces in ((src, source_text, source_pieces), (tgt, target_text, target_pieces)):
            distilled.text(split, lang).write_text(_lines(text), encoding="utf-8")
            distilled.pieces(split, lang).write_text(_lines(pieces), encoding="utf-8")
        left_out = {line - 1 for line in bin_left_out}
        kept = [i for i in range(len(source_tokens)) if i not in left_out]
        if student_pieces is None:
            binarize(distilled.bin.root, split, src, tgt, dict_dir, [source_tokens[i] for i in kept],
                     [target_pieces[i] for i in kept])
        else:
            meta["student_vocabulary"].update(binarize(
                distilled.bin.root, split, src, tgt, dict_dir, None, [student_pieces[1][i] for i in kept],
                [student_pieces[0][i] for i in kept]))
        meta["files"]["original_splits_in_bin"] = copy_other_splits(data_dir, distilled.bin.root, split, src, tgt)
        atomic.write_json(distilled.meta_file, meta)
        if sentence_scores is not None:
            sentence_scores.write(distilled.scores_file)
            write_card(distilled, build_card(meta, source=source_text, reference=references, target=target_text,
                                             scores=sentence_scores), sentence_scores)
