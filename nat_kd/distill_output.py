"""Write the distilled corpus: text, sentencepiece pieces, a fairseq-binarized copy, meta.json; atomically."""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import sacrebleu

from . import atomic

logger = logging.getLogger("nat_kd.generate_distilled")


def _lines(lines) -> str:
    return "".join(line + "\n" for line in lines)


def binarize(work: Path, split: str, src: str, tgt: str, dict_dir: Path) -> None:
    """fairseq-preprocess over the pieces with the teacher's dictionaries, so ids match the teacher's."""
    from fairseq import options
    from fairseq_cli import preprocess

    # fairseq-preprocess names its outputs train/valid/test; write "train" and rename to the real split.
    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", src, "--target-lang", tgt, "--trainpref", str(work / "spm" / split),
        "--destdir", str(work / "bin"), "--srcdict", str(dict_dir / f"dict.{src}.txt"),
        "--tgtdict", str(dict_dir / f"dict.{tgt}.txt"), "--workers", "1",
    ])
    preprocess.main(args)
    (work / "bin" / "preprocess.log").unlink(missing_ok=True)  # timestamps; the run's record is meta.json
    if split != "train":
        for file in (work / "bin").glob(f"train.{src}-{tgt}.*"):
            os.replace(file, file.with_name(split + file.name[len("train"):]))


def copy_other_splits(data_dir: Path | None, bin_dir: Path, split: str, src: str, tgt: str) -> list[str]:
    """The original data's other splits (valid, test: real references) beside the distilled one, so that
    fairseq-train can validate on them at once; returns their names."""
    if data_dir is None:
        return []
    copied = set()
    for file in sorted(Path(data_dir).glob(f"*.{src}-{tgt}.*")):
        name = file.name.split(".")[0]
        if name != split and file.suffix in (".bin", ".idx"):
            shutil.copyfile(file, bin_dir / file.name)
            copied.add(name)
    return sorted(copied)


def scores(hypotheses: list[str], references: list[str] | None) -> dict:
    """Corpus BLEU/chrF against the references and the length ratios (whitespace words)."""
    if references is None:
        return {}
    bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    ratios = [len(h.split()) / max(1, len(r.split())) for h, r in zip(hypotheses, references)]
    return {"bleu": round(bleu.score, 4), "chrf": round(chrf.score, 4), "bleu_signature": str(bleu_metric.get_signature()),
            "chrf_signature": str(chrf_metric.get_signature()),
            # sacrebleu's sys_len / ref_len over the corpus, and the mean of per-sentence word-count ratios
            "length_ratio_corpus": round(bleu.sys_len / max(1, bleu.ref_len), 4),
            "mean_length_ratio": round(sum(ratios) / len(ratios), 4)}


def write_output(out_dir: Path, *, split: str, src: str, tgt: str, source_text: list[str],
                 source_pieces: list[str], target_pieces: list[str], target_text: list[str],
                 dict_dir: Path, meta: dict, data_dir: Path | None = None) -> None:
    if not (len(source_text) == len(source_pieces) == len(target_pieces) == len(target_text)):
        raise AssertionError("distilled output is not line-aligned with the source; this is a bug")
    with atomic.building_directory(out_dir) as work:
        (work / f"{split}.{src}").write_text(_lines(source_text), encoding="utf-8")
        (work / f"{split}.{tgt}").write_text(_lines(target_text), encoding="utf-8")
        (work / "spm").mkdir()
        (work / "spm" / f"{split}.{src}").write_text(_lines(source_pieces), encoding="utf-8")
        (work / "spm" / f"{split}.{tgt}").write_text(_lines(target_pieces), encoding="utf-8")
        binarize(work, split, src, tgt, dict_dir)
        meta["files"]["original_splits_in_bin"] = copy_other_splits(data_dir, work / "bin", split, src, tgt)
        atomic.write_json(work / "meta.json", meta)
