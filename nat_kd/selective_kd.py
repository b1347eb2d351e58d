"""Selective KD (Liu et al., AAAI 2023) as NJUNLP/SelectiveKD trains it: a distilled set with the raw targets of
its lines beside it, and a frozen evaluator's accuracy on each raw target, one number a line.

    python -m nat_kd.selective_kd --distilled runs/distill/beam5 --prepared data/multi30k.en-de.spm8000 \\
        --evaluator runs/evaluator/checkpoint_best.pt --out runs/distill/beam5.selective-kd

The evaluator is a CTC student trained on the distilled set (``kd_glat_ctc_*``, as the authors' recipe, or
``kd_ctc_*``). Its accuracy on a line is the share of its positions whose argmax is the label of the raw target's
best CTC alignment, from one pass without glancing or dropout (fairseq_plugins/models/ctc.py,
``ctc_alignment_accuracy``). The authors' task computes it batch by batch during training; the evaluator is
frozen, so it is computed once here. fairseq-train's ``--task selective_kd_translation_lev`` then trains each
sentence of each batch on its distilled target where the accuracy is below ``--kd-threshold`` + update /
``--kd-threshold-updates`` x ``--kd-threshold-offset``, on its raw target otherwise.

The set is the distilled set (its texts, pieces, binarized pairs, scores and card: every tool reads it as that
set) with SPLIT.raw.TGT, spm/SPLIT.raw.TGT, bin/SPLIT.raw.SRC-TGT.TGT (the raw targets, in the set's tokens)
and bin/SPLIT.evaluator_accuracy.txt (one accuracy a binarized line), and meta.json's ``selective_kd``: the
evaluator's checkpoint and digest, the accuracy file's digest, the mean accuracy. Written atomically.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

import numpy as np

from nat_kd import __version__, atomic, cli
from nat_kd.artifacts import DistilledSet, PreparedCorpus
from nat_kd.corpus import CorpusError, read_lines
from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file

logger = logging.getLogger("nat_kd.selective_kd")
EVALUATOR_FAMILIES = ("glat_ctc", "ctc")  # students with a CTC alignment to score


def accuracies(model, sources: list, targets: list, max_tokens: int = 4096) -> np.ndarray:
    """``model.alignment_accuracy`` of each line: ``sources`` as bin/ holds them (ids ending in </s>),
    ``targets`` the raw targets' ids (ending in </s>), framed with <s> here as translation_lev frames them; in
    batches of about ``max_tokens`` source tokens, shortest first."""
    import torch
    from fairseq.data import data_utils

    pad, bos = model.pad, model.bos
    out = np.zeros(len(sources))
    lengths = np.array([len(s) for s in sources])
    order = np.argsort(lengths, kind="stable")
    start = 0
    with torch.no_grad():
        while start < len(order):
            end = start + 1  # the batch's longest source is its last
            while end < len(order) and lengths[order[end]] * (end - start + 1) <= max_tokens:
                end += 1
            lines = order[start:end]
            src = data_utils.collate_tokens([torch.as_tensor(sources[i], dtype=torch.long) for i in lines], pad,
                                            left_pad=True)
            tgt = data_utils.collate_tokens([torch.as_tensor(np.concatenate([[bos], targets[i]]), dtype=torch.long)
                                             for i in lines], pad)
            out[lines] = model.alignment_accuracy(src, src.ne(pad).sum(1), tgt).double().numpy()
            start = end
    return out


def load_evaluator(checkpoint: str | Path, dict_dir: Path):
    """The evaluator checkpoint's model (eval mode, on the CPU), with the set's dictionaries."""
    from fairseq_plugins.teacher import TeacherEnsemble

    model = TeacherEnsemble.load(str(checkpoint), dict_dir=dict_dir, flags=("--evaluator", "--distilled")).models[0]
    if not hasattr(model, "alignment_accuracy"):
        raise SettingsError(f"--evaluator {checkpoint} is a {type(model).__name__}, which has no CTC alignment: give "
                            f"a CTC student's checkpoint ({', '.join(f'kd_{f}_*' for f in EVALUATOR_FAMILIES)}) "
                            "trained on the distilled set")
    return model


class _RawTargets:
    """A distilled set's raw targets, from the prepared corpus it was distilled from: text, pieces, and the ids of
    the lines its bin/ holds, in the set's dictionary."""

    def __init__(self, corpus: PreparedCorpus, source_set: DistilledSet, meta: dict):
        from fairseq.data import Dictionary

        from nat_kd.distill.output import lookup
        from nat_kd.mix import real_pieces

        self.split, self.src, self.tgt = meta["split"], meta["source_lang"], meta["target_lang"]
        self.text = read_lines(corpus.raw(self.split, self.tgt))
        self.pieces = real_pieces(corpus, None, None, self.split, self.tgt)
        if not len(self.text) == len(self.pieces) == meta["sentences"]:
            raise CorpusError(f"{corpus.raw(self.split, self.tgt)} has {len(self.text)} lines, {source_set.root} "
                              f"{meta['sentences']}: pass the prepared corpus the set was distilled from")
        self.dictionary = Dictionary.load(str(source_set.bin.dictionary(self.tgt)))
        left_out = {line - 1 for line in meta.get("files", {}).get("binarized_left_out_lines", [])}
        self.ids, _, _ = lookup(self.dictionary, [p for i, p in enumerate(self.pieces) if i not in left_out])

    def write(self, folder: DistilledSet) -> None:
        """SPLIT.raw.TGT, its pieces and its binarized lines, beside the set's own."""
        from fairseq_plugins.tasks import RAW_TARGETS
        from nat_kd.distill.output import write_indexed

        raw = f"{self.split}.{RAW_TARGETS}"
        (folder.root / f"{raw}.{self.tgt}").write_text("".join(t + "\n" for t in self.text), encoding="utf-8")
        (folder.pieces_dir / f"{raw}.{self.tgt}").write_text("".join(p + "\n" for p in self.pieces),
                                                           encoding="utf-8")
        write_indexed(folder.bin.prefix(raw, self.src, self.tgt, self.tgt), self.dictionary, self.ids)


def rebuild(folder: str | Path, distilled_dir: str | Path, prepared: str | Path) -> None:
    """A Selective KD set whose meta.json and accuracy file alone are there (a store keeps no more of it,
    nat_kd.engine.steps.kept_selection): its distilled set's files and its raw targets made again beside them."""
    folder, source_set = DistilledSet(folder), DistilledSet(distilled_dir)
    for file in sorted(p for p in source_set.root.rglob("*") if p.is_file()):
        target = folder.root / file.relative_to(source_set.root)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, target)
    _RawTargets(PreparedCorpus(prepared), source_set, folder.meta()).write(folder)


def build(distilled_dir: str | Path, out_dir: str | Path, evaluator: str | Path, prepared: str | Path, *,
          name: str | None = None, max_tokens: int = 4096) -> dict:
    """The Selective KD set of ``distilled_dir`` in ``out_dir``, its accuracies by ``evaluator`` on the raw
    targets of ``prepared``; returns its meta.json."""
    from fairseq.data import data_utils

    from fairseq_plugins.tasks import ACCURACY_FILE
    from nat_kd.distill.pipeline import check_set_folder
    from nat_kd.mix import check_same_tokens

    source_set, out, corpus = DistilledSet(distilled_dir), DistilledSet(out_dir), PreparedCorpus(prepared)
    meta = source_set.meta()
    if meta is None:
        raise CorpusError(f"{source_set.root} has no meta.json: pass a set written by nat_kd.generate_distilled")
    if out.root.resolve() == source_set.root.resolve():
        raise SettingsError(f"--out {out.root} is the distilled set itself; choose another folder")
    if meta.get("student_vocabulary"):
        raise SettingsError(f"{source_set.root} is binarized in a student's tokens (--student-data): give a set in "
                            "the teacher's tokens, those of --prepared")
    check_set_folder(out)
    check_same_tokens(corpus, source_set, meta)
    split, src, tgt = meta["split"], meta["source_lang"], meta["target_lang"]
    raw = _RawTargets(corpus, source_set, meta)
    source_ids = data_utils.load_indexed_dataset(str(source_set.bin.prefix(split, src, tgt, src)), None)
    sources = [source_ids[i].numpy() for i in range(len(source_ids))]
    if len(sources) != len(raw.ids):
        raise CorpusError(f"{source_set.bin.root} holds {len(sources)} {split} pairs, meta.json says "
                          f"{len(raw.ids)}: regenerate the set")
    model = load_evaluator(evaluator, source_set.bin.root)
    accuracy = accuracies(model, sources, raw.ids, max_tokens)
    accuracy_name = ACCURACY_FILE.format(split=split)
    with atomic.building_directory(out.root) as work:
        shutil.copytree(source_set.root, work, dirs_exist_ok=True)
        built = DistilledSet(work)
        raw.write(built)
        (built.bin.root / accuracy_name).write_text("".join(f"{a:.6f}\n" for a in accuracy), encoding="utf-8")
        record = {"evaluator": str(Path(evaluator).resolve()), "evaluator_sha256": sha256_file(evaluator),
                  "accuracy_file": f"{built.bin.root.name}/{accuracy_name}",
                  "accuracy_sha256": sha256_file(built.bin.root / accuracy_name),
                  "lines": len(accuracy), "mean_accuracy": round(float(accuracy.mean()), 4),
                  "raw_targets": str(corpus.raw(split, tgt).resolve())}
        new_meta = {**meta, "name": name or out.root.name, "strategy": f"{meta.get('strategy', '')}+selective-kd",
                    "selective_kd": record, "nat_kd_version": __version__}
        atomic.write_json(built.meta_file, new_meta)
    return new_meta


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nat_kd.selective_kd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--distilled", required=True, help="the distilled set folder (meta.json, bin/)")
    p.add_argument("--prepared", required=True, help="nat_kd.prepare output: its raw/ and spm/ targets are the raw ones")
    p.add_argument("--evaluator", required=True, metavar="CHECKPOINT",
                   help="a CTC student (kd_glat_ctc_*, kd_ctc_*) trained on the distilled set")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--name", help="name recorded in meta.json (default: the output folder's name)")
    p.add_argument("--max-tokens", type=int, default=4096, help="source tokens a batch of the evaluator (default 4096)")
    cli.add_verbose_argument(p)
    return p


def main(argv=None) -> int:
    cli.setup_logging(argv)
    args = build_parser().parse_args(argv)

    def body():
        meta = build(args.distilled, args.out, args.evaluator, args.prepared, name=args.name,
                     max_tokens=args.max_tokens)
        record = meta["selective_kd"]
        print(f"{args.out}: the evaluator's mean accuracy on the raw targets {record['mean_accuracy']:.4f} over "
              f"{record['lines']:,} lines ({record['accuracy_file']})")

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
