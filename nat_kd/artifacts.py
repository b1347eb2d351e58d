"""The toolkit's on-disk artefacts, each file named once: a prepared corpus, a fairseq-binarized folder, and a
distilled set. Code that reads or writes one of them asks these types for the path instead of building it.

    PreparedCorpus(DIR)   nat_kd.prepare's output: raw/, spm/, spm.model or bpe.codes, bin/, manifest.json
    BinarizedData(DIR)    fairseq-preprocess's layout: dict.LANG.txt, SPLIT.SRC-TGT.LANG.{bin,idx}
    DistilledSet(DIR)     nat_kd.generate_distilled's (or nat_kd.mix's) output: SPLIT.LANG, spm/, bin/, meta.json,
                          scores.tsv, CARD.md, card.json, card_scores.png
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .corpus import CorpusError
from .tokenization import TokenizationSettings


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CorpusError(f"{path}:{err.lineno}: invalid JSON ({err.msg}); rebuild that folder") from None


def _file(name: str, doc: str | None = None) -> property:
    """A file (or subfolder) of the artefact's folder with a fixed name, as a read-only path property."""
    return property(lambda self: self.root / name, doc=doc or name)


@dataclass(frozen=True)
class _Folder:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))


class BinarizedData(_Folder):
    """A fairseq-binarized folder, as fairseq-preprocess writes it (and fairseq-train reads it)."""

    def dictionary(self, lang: str) -> Path:
        return self.root / f"dict.{lang}.txt"

    def prefix(self, split: str, src: str, tgt: str, lang: str) -> Path:
        """SPLIT.SRC-TGT.LANG, the stem of the .bin/.idx pair holding one side of one split."""
        return self.root / f"{split}.{src}-{tgt}.{lang}"

    def split_files(self, src: str, tgt: str) -> list[Path]:
        """Every .bin/.idx file of the pair, sorted."""
        return [f for f in sorted(self.root.glob(f"*.{src}-{tgt}.*")) if f.suffix in (".bin", ".idx")]

    @staticmethod
    def split_of(file: Path) -> str:
        """The split a .bin/.idx file belongs to."""
        return file.name.split(".")[0]


class PreparedCorpus(_Folder):
    """nat_kd.prepare's output folder; its module docstring says what each file holds."""

    manifest_file = _file("manifest.json")
    source_file = _file("source.json", "where the corpus was read from (kept out of manifest.json)")
    # what a command that takes only such a folder says of another one (a fairseq-binarized corpus, say)
    HOW_TO_MAKE = ("make one from the corpus's raw text in its own tokens: python -m nat_kd.prepare --src SRC --tgt "
                   "TGT --trainpref RAW/train --validpref RAW/valid --testpref RAW/test --bpe-codes CODES --tokenizer "
                   "moses (or --spm-model M) --out-dir DIR, then distil with --student-data DIR "
                   "(docs/own_corpus.md)")
    spm_model = _file("spm.model")
    bpe_codes = _file("bpe.codes", "(a corpus prepared with --bpe-codes) a copy of the subword-nmt codes")

    @property
    def bin(self) -> BinarizedData:
        return BinarizedData(self.root / "bin")

    def relative_tokenization(self, settings: TokenizationSettings) -> dict:
        """``settings`` for manifest.json, with the files inside this folder named relative to it (the folder
        may be renamed or moved)."""
        def relative(section):
            return {k: (Path(v).name if k in ("sentencepiece_model", "bpe_codes") else v)
                    for k, v in section.items()} if section else None

        return {"bpe": relative(settings.bpe), "tokenizer": relative(settings.tokenizer)}

    def tokenization(self) -> TokenizationSettings:
        """How the corpus's tokens were made from its text: manifest.json's ``tokenization``, else (corpora
        prepared before it was recorded, and every default one) the sentencepiece model spm.model."""
        recorded = (self.manifest() or {}).get("tokenization")
        if recorded is None:
            return TokenizationSettings.sentencepiece(self.spm_model)

        def absolute(section):
            return {k: (str(self.root / v) if k in ("sentencepiece_model", "bpe_codes") else v)
                    for k, v in section.items()} if section else None

        return TokenizationSettings(bpe=absolute(recorded.get("bpe")), tokenizer=absolute(recorded.get("tokenizer")))

    def raw(self, split: str, lang: str) -> Path:
        """The raw (detokenized) text of one side of a split, e.g. the references for BLEU."""
        return self.root / "raw" / f"{split}.{lang}"

    def pieces_prefix(self, split: str) -> Path:
        """spm/SPLIT, the prefix fairseq-preprocess reads (--trainpref and the like)."""
        return self.root / "spm" / split

    def pieces(self, split: str, lang: str) -> Path:
        return self.root / "spm" / f"{split}.{lang}"

    def languages_file(self, split: str) -> Path:
        """(mix only) the true language of each target line."""
        return self.root / f"{split}.lang"

    def manifest(self) -> dict | None:
        return _read_json(self.manifest_file) if self.manifest_file.is_file() else None

    def language_pair(self) -> tuple[str, str]:
        config = (self.manifest() or {}).get("config", {})
        if not (config.get("src") and config.get("tgt")):
            raise CorpusError(f"{self.root} has no manifest.json naming its languages; is it nat_kd.prepare output? "
                              f"If not, {self.HOW_TO_MAKE}")
        return config["src"], config["tgt"]


class DistilledSet(_Folder):
    """nat_kd.generate_distilled's output folder (docs/generate_distilled.md lists what each file holds)."""

    meta_file = _file("meta.json")

    @property
    def bin(self) -> BinarizedData:
        return BinarizedData(self.root / "bin")

    @property
    def progress_dir(self) -> Path:
        """OUT.partial/, beside the set: the chunks decoded so far (removed once the set is complete)."""
        return self.root.with_name(self.root.name + ".partial")

    def text(self, split: str, lang: str) -> Path:
        """One side, detokenized, line-aligned with the input: the source as given, or the distilled targets."""
        return self.root / f"{split}.{lang}"

    pieces_dir = _file("spm")

    def pieces(self, split: str, lang: str) -> Path:
        """The same in the teacher's own tokens (sentencepiece pieces, or BPE units with their joiners)."""
        return self.pieces_dir / f"{split}.{lang}"

    scores_file = _file("scores.tsv", "each line's scores against its reference (nat_kd.analysis.metrics.sentence)")
    card_markdown = _file("CARD.md", "the dataset card (nat_kd.analysis.card), for people")
    card_json = _file("card.json", "the same card for programs")
    card_figure = _file("card_scores.png", "the card's histograms of the per-line scores")

    def meta(self) -> dict | None:
        """meta.json, or None while the set is not complete."""
        return _read_json(self.meta_file) if self.meta_file.is_file() else None

    def real_repeats(self) -> int:
        """How many times over the set's lines pair with the real data's: a union of K sets of the same sources
        (nat_kd.references --union) holds their pairs one set after the other, so K; any other set once."""
        meta = self.meta() or {}
        return len(meta["union"]["sets"]) if meta.get("strategy") == "union" else 1
