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


def binarize(bin_dir: Path, split: str, src: str, tgt: str, dict_dir: Path, source_tokens: list,
             target_pieces: list[str]) -> None:
    """The binarized split with the teacher's dictionaries: byte for byte what fairseq-preprocess writes from
    the spm/ files, built from what we hold instead of re-reading and re-encoding them. The source side is the
    token ids the teacher read (spm/ spells exactly these: no EOS or BOS inside a sentence); target pieces are
    looked up as Dictionary.encode_line does (fairseq's whitespace split, unknown pieces to <unk>, EOS
    appended), without its element-by-element tensor writes."""
    import torch
    from fairseq.data import Dictionary
    from fairseq.tokenizer import tokenize_line

    out, teacher_data = BinarizedData(bin_dir), BinarizedData(dict_dir)
    out.root.mkdir()
    src_dict, tgt_dict = (Dictionary.load(str(teacher_data.dictionary(lang))) for lang in (src, tgt))
    for lang, dictionary in ((src, src_dict), (tgt, tgt_dict)):
        dictionary.save(str(out.dictionary(lang)))  # as fairseq-preprocess saves them
    write_indexed(out.prefix(split, src, tgt, src), src_dict, source_tokens)
    indices, unk, eos = tgt_dict.indices, tgt_dict.unk(), tgt_dict.eos()
    write_indexed(out.prefix(split, src, tgt, tgt), tgt_dict,
                  (torch.IntTensor([indices.get(word, unk) for word in tokenize_line(line)] + [eos])
                   for line in target_pieces))


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
                 references: list[str] | None = None, sentence_scores: SentenceScores | None = None) -> None:
    """The whole set in a temporary folder renamed into place: texts and pieces with every line, bin/ with all
    but the ``bin_left_out`` lines (1-based: pairs that would only add noise to a training set, such as empty
    sources), meta.json, and each line's scores with the dataset card when ``sentence_scores`` are given."""
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
        binarize(distilled.bin.root, split, src, tgt, dict_dir, [source_tokens[i] for i in kept],
                 [target_pieces[i] for i in kept])
        meta["files"]["original_splits_in_bin"] = copy_other_splits(data_dir, distilled.bin.root, split, src, tgt)
        atomic.write_json(distilled.meta_file, meta)
        if sentence_scores is not None:
            sentence_scores.write(distilled.scores_file)
            write_card(distilled, build_card(meta, source=source_text, reference=references, target=target_text,
                                             scores=sentence_scores), sentence_scores)
