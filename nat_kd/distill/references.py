"""Several references a sentence: one training set from distilled sets of the same sources (each teacher's
output decoded separately, not as an ensemble: DDRS, Shao et al., NAACL 2022).

    python -m nat_kd.references --sets runs/distill/t1.beam runs/distill/t2.beam runs/distill/t3.beam \\
        --out runs/distill/three-teachers [--union]

The multi-reference set is the first set (its texts, pieces, binarized pairs, scores and card: every tool
reads it as that set) with the others' targets beside it as references 2..K, line-aligned:
SPLIT.refK.TGT, spm/SPLIT.refK.TGT, and bin/SPLIT.refK.SRC-TGT.TGT, which fairseq-train reads with
``--task kd_translation_lev --references K`` for a student whose criterion takes them
(``--criterion multi_reference_nat_loss --reference-selection ddrs``). With ``--union`` it is a plain set of
the sets' pairs one after the other (K x N lines, one target each): plain KD on all of them; given the real
targets (``--prepared``), its scores are against them repeated once for each set. Either way
meta.json records each reference's set, its BLEU against the real targets, and the references' diversity (the
BLEU of each against each other). Written atomically, in seconds: each set is resumable by itself, as the
generator writes it.
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

logger = logging.getLogger("nat_kd.references")


def reference_file(folder: Path, split: str, lang: str, k: int) -> Path:
    """The text of reference ``k`` (2..K) of a multi-reference set; the first is the set's own SPLIT.LANG."""
    return Path(folder) / f"{split}.ref{k}.{lang}"


def diversity(targets: list[list[str]]) -> dict:
    """sacrebleu's corpus BLEU of each reference against each other one ([i][j]: i scored against j as its
    reference; None on the diagonal), and the mean over the pairs: the lower, the more the teachers differ."""
    import sacrebleu

    matrix = [[None if i == j else round(sacrebleu.corpus_bleu(a, [b]).score, 2) for j, b in enumerate(targets)]
              for i, a in enumerate(targets)]
    pairs = [v for row in matrix for v in row if v is not None]
    return {"pairwise_bleu": matrix, "mean_pairwise_bleu": round(sum(pairs) / len(pairs), 2)}


class _Sets:
    """The distilled sets read and checked: one split and language pair, the same sources line for line,
    the same dictionaries and the same lines left out of bin/."""

    def __init__(self, folders: list[str | Path]):
        if len(folders) < 2:
            raise SettingsError("--sets: give two distilled sets or more")
        self.sets = [DistilledSet(f) for f in folders]
        self.metas = []
        for s in self.sets:
            meta = s.meta()
            if meta is None:
                raise CorpusError(f"{s.root} has no meta.json: pass sets written by nat_kd.generate_distilled (or "
                                  "nat_kd.mix)")
            self.metas.append(meta)
        first, meta = self.sets[0], self.metas[0]
        self.split, self.src, self.tgt = meta["split"], meta["source_lang"], meta["target_lang"]
        self.sources = read_lines(first.text(self.split, self.src))
        self.left_out = meta.get("files", {}).get("binarized_left_out_lines", [])
        for s, m in zip(self.sets[1:], self.metas[1:]):
            self._check(s, m)
        self.targets = [read_lines(s.text(self.split, self.tgt)) for s in self.sets]
        self.pieces = [read_lines(s.pieces(self.split, self.tgt)) for s in self.sets]

    def _check(self, other: DistilledSet, meta: dict) -> None:
        first = self.sets[0]
        if (meta["split"], meta["source_lang"], meta["target_lang"]) != (self.split, self.src, self.tgt):
            raise CorpusError(f"{other.root} is {meta['split']} {meta['source_lang']}-{meta['target_lang']}, "
                              f"{first.root} {self.split} {self.src}-{self.tgt}: give sets of one split and pair")
        sources = read_lines(other.text(self.split, self.src))
        if sources != self.sources:
            line = next((i for i, (a, b) in enumerate(zip(sources, self.sources), 1) if a != b),
                        min(len(sources), len(self.sources)) + 1)
            raise CorpusError(f"{other.text(self.split, self.src)} differs from {first.text(self.split, self.src)} "
                              f"at line {line}: the sets must decode the same sources")
        for lang in (self.src, self.tgt):
            if sha256_file(other.bin.dictionary(lang)) != sha256_file(first.bin.dictionary(lang)):
                raise CorpusError(f"{other.bin.dictionary(lang)} differs from {first.bin.dictionary(lang)}: the sets "
                                  "must be binarized with the same dictionaries")
        if meta.get("files", {}).get("binarized_left_out_lines", []) != self.left_out:
            raise CorpusError(f"{other.root} leaves other lines out of bin/ than {first.root}")

    def described(self) -> list[dict]:
        return [{"set": str(s.root.resolve()), "name": m.get("name", s.root.name), "strategy": m.get("strategy"),
                 "teacher": m.get("teacher"), "meta_sha256": sha256_file(s.meta_file),
                 "bleu_vs_reference": m.get("scores", {}).get("bleu")} for s, m in zip(self.sets, self.metas)]


def build(set_folders: list[str | Path], out_dir: str | Path, *, union: bool = False, name: str | None = None,
          reference: str | Path | None = None) -> dict:
    """The multi-reference set (or with ``union`` the union set) of ``set_folders`` in ``out_dir``; returns
    its meta.json. ``reference``: the real targets, for the union set's scores and card (a multi-reference set
    keeps its first set's)."""
    from nat_kd.distill.pipeline import check_set_folder

    sets = _Sets(set_folders)
    out = DistilledSet(out_dir)
    if any(out.root.resolve() == s.root.resolve() for s in sets.sets):
        raise SettingsError(f"--out {out.root} is one of the sets; choose another folder")
    check_set_folder(out)
    record = {"sets": sets.described(), **diversity(sets.targets)}
    if union:
        return _union(sets, out, record, name, read_lines(reference) if reference else None)
    return _multi_reference(sets, out, record, name)


def _multi_reference(sets: _Sets, out: DistilledSet, record: dict, name: str | None) -> dict:
    """The first set, with the others' targets as references 2..K (text, pieces, binarized)."""
    from fairseq.data import Dictionary

    from nat_kd.distill.output import lookup, write_indexed

    dictionary = Dictionary.load(str(sets.sets[0].bin.dictionary(sets.tgt)))
    left_out = {line - 1 for line in sets.left_out}
    kept = [i for i in range(len(sets.sources)) if i not in left_out]
    meta = {**sets.metas[0], "name": name or out.root.name, "strategy": "multi-reference",
            "references": {"count": len(sets.sets), **record}, "nat_kd_version": __version__}
    with atomic.building_directory(out.root) as work:
        shutil.copytree(sets.sets[0].root, work, dirs_exist_ok=True)
        built = DistilledSet(work)
        for k, (targets, pieces) in enumerate(zip(sets.targets[1:], sets.pieces[1:]), start=2):
            reference_file(work, sets.split, sets.tgt, k).write_text("".join(t + "\n" for t in targets),
                                                                     encoding="utf-8")
            reference_file(built.pieces_dir, sets.split, sets.tgt, k).write_text("".join(p + "\n" for p in pieces),
                                                                                encoding="utf-8")
            ids, _, _ = lookup(dictionary, [pieces[i] for i in kept])
            write_indexed(built.bin.prefix(f"{sets.split}.ref{k}", sets.src, sets.tgt, sets.tgt), dictionary, ids)
        atomic.write_json(built.meta_file, meta)
    return meta


def _union(sets: _Sets, out: DistilledSet, record: dict, name: str | None, reference: list[str] | None) -> dict:
    """The sets' pairs one after the other, one target a line, written as the generator writes a set."""
    from nat_kd.analysis.metrics.sentence import SentenceScores
    from nat_kd.distill.output import write_output
    from nat_kd.distill.scores import scores as corpus_scores, statistics
    from nat_kd.distill.source import source_token_lines

    count, first = len(sets.sets), sets.sets[0]
    tokens = source_token_lines(first, sets.metas[0])
    scores = [SentenceScores.read(s.scores_file) for s in sets.sets if s.scores_file.is_file()]
    columns = set.intersection(*(set(s.columns) for s in scores)) if len(scores) == count else set()
    joined = (SentenceScores({c: np.concatenate([s.columns[c] for s in scores]) for c in sorted(columns)},
                             scores[0].settings) if columns else None)
    lines = len(sets.sources)
    targets = [t for set_targets in sets.targets for t in set_targets]
    # each set's lines pair with the real targets: the union's BLEU is against them once for each set
    references = reference * count if reference else None
    left_out = [line + k * lines for k in range(count) for line in sets.left_out]
    meta = {**{k: sets.metas[0][k] for k in ("split", "source_lang", "target_lang", "corpus", "settings",
                                             "all_settings", "backend", "max_source_positions") if k in sets.metas[0]},
            "name": name or out.root.name, "strategy": "union", "sentences": lines * count,
            "empty_source_lines": [], "truncated_source_lines": [], "union": record, "nat_kd_version": __version__,
            "teacher": sets.metas[0].get("teacher"),
            "scores": corpus_scores([statistics(targets, references)], targets, references) if references else {},
            "files": {"source": out.text(sets.split, sets.src).name, "target": out.text(sets.split, sets.tgt).name,
                      "binarized": f"{out.bin.root.name}/", "pieces": f"{out.pieces_dir.name}/",
                      "binarized_sentences": (lines - len(sets.left_out)) * count,
                      "binarized_left_out_lines": left_out, "scores": out.scores_file.name,
                      "card": [out.card_markdown.name, out.card_json.name]}}
    write_output(out.root, split=sets.split, src=sets.src, tgt=sets.tgt, source_text=sets.sources * count,
                 source_tokens=tokens * count, source_pieces=read_lines(first.pieces(sets.split, sets.src)) * count,
                 target_pieces=[p for pieces in sets.pieces for p in pieces],
                 target_text=targets, dict_dir=first.bin.root, meta=meta,
                 data_dir=first.bin.root, bin_left_out=left_out, references=references,
                 sentence_scores=joined)
    return meta


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nat_kd.references", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", nargs="+", required=True, help="distilled sets of the same sources, the first the main "
                                                             "reference")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--union", action="store_true", help="the sets' pairs one after the other, one target a line")
    p.add_argument("--prepared", help="nat_kd.prepare output: its raw real targets go into the union set's card")
    p.add_argument("--name", help="name recorded in meta.json (default: the output folder's name)")
    cli.add_verbose_argument(p)
    return p


def main(argv=None) -> int:
    cli.setup_logging(argv)
    args = build_parser().parse_args(argv)

    def body():
        reference = None
        if args.prepared:
            meta = DistilledSet(args.sets[0]).meta() or {}
            reference = PreparedCorpus(args.prepared).raw(meta.get("split", "train"), meta.get("target_lang", ""))
        meta = build(args.sets, args.out, union=args.union, name=args.name, reference=reference)
        record = meta["union"] if args.union else meta["references"]
        what = f"{meta['sentences']:,} pairs" if args.union else f"{record['count']} references a line"
        print(f"{args.out}: {what}; the references' mean BLEU against each other {record['mean_pairwise_bleu']:.2f}")

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
