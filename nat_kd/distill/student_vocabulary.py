"""``--student-data DIR``: the distilled set in the student's vocabulary. The texts (the source as given, the
targets detokenized) are re-encoded with the student's tokenization and binarized with its dictionaries, both
from a nat_kd.prepare folder (nat_kd.artifacts.PreparedCorpus), so bin/ is ready for fairseq-train whatever
tokens the teacher wrote (a published teacher's own, or a fairseq teacher's other vocabulary)."""
from __future__ import annotations

import logging
from pathlib import Path

from nat_kd.artifacts import PreparedCorpus
from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file

logger = logging.getLogger("nat_kd.distill.student_vocabulary")

# a larger share of the targets' tokens outside the student's dictionary is warned about (and on the card)
UNK_WARNING_SHARE = 0.01


class StudentData:
    def __init__(self, folder: str | Path, src: str, tgt: str):
        self.prepared = PreparedCorpus(folder)
        self.src, self.tgt = src, tgt
        pair = self.prepared.language_pair()
        if pair != (src, tgt):
            raise SettingsError(f"--student-data {folder} is {pair[0]}-{pair[1]}, the distilled set {src}-{tgt}: give "
                                "the student's prepared folder of the same language pair")
        self.bin_dir = self.prepared.bin.root
        for lang in (src, tgt):
            if not self.prepared.bin.dictionary(lang).is_file():
                raise SettingsError(f"--student-data {folder}: no {self.prepared.bin.dictionary(lang)}; is it "
                                    "nat_kd.prepare output?")
        self.tokenization = self.prepared.tokenization()

    @classmethod
    def recorded(cls, meta: dict, meta_file: Path) -> StudentData | None:
        """The student's data a set's bin/ was written in (meta.json's ``student_vocabulary``; None for a set in
        the teacher's tokens), refused unless it still tokenizes and binarizes as the generator's fingerprint
        recorded: bin/ rewritten from the texts with other data would silently be in another vocabulary than the
        set's, for another student than the one it was made for."""
        recorded = meta.get("student_vocabulary")
        if recorded is None:
            return None
        folder = recorded["data"]
        fix = "restore it as it was, or regenerate the set with generate_distilled --student-data"
        if not PreparedCorpus(folder).manifest_file.is_file():
            raise SettingsError(f"{meta_file} records bin/ in the tokens of the student's data {folder}, which is "
                                f"gone (no manifest.json): {fix}")
        student = cls(folder, meta["source_lang"], meta["target_lang"])
        if student.fingerprint() != meta.get("fingerprint", {}).get("student_data"):
            raise SettingsError(f"{meta_file} records bin/ in the tokens of the student's data {folder}, whose "
                                f"tokenization or dictionaries are not those its fingerprint.student_data records: "
                                f"{fix}")
        return student

    def encode(self, source: list[str], target: list[str]) -> tuple[list[str], list[str]]:
        """The texts in the student's tokens."""
        from nat_kd.tokenization import Tokenization

        return (Tokenization(self.tokenization, self.src).encode_all(source),
                Tokenization(self.tokenization, self.tgt).encode_all(target))

    def fingerprint(self) -> dict:
        """What bin/ depends on besides the texts: the student's tokenization and dictionaries."""
        return {"tokenization": self.tokenization.fingerprint(),
                "dictionaries": [sha256_file(self.prepared.bin.dictionary(lang)) for lang in (self.src, self.tgt)]}

    def describe(self) -> dict:
        return {"data": str(self.prepared.root.resolve()), "tokenization": self.tokenization.describe(),
                "dictionaries": str(self.bin_dir.resolve()), "unk_warning_share": UNK_WARNING_SHARE}

    def bin_arguments(self, source_text: list[str], target_text: list[str], meta: dict) -> dict:
        """write_output's arguments for a bin/ in the student's tokens: the texts encoded, its dictionaries and
        its data's other splits. ``meta`` gets ``student_vocabulary``, which write_output completes with each
        side's token and <unk> counts (then ``warn_unknown``)."""
        meta["student_vocabulary"] = self.describe()
        return {"student_pieces": self.encode(source_text, target_text), "dict_dir": self.bin_dir,
                "data_dir": self.bin_dir}

    def warn_unknown(self, meta: dict) -> None:
        share = meta["student_vocabulary"]["target"]["unk_share"]
        if share > UNK_WARNING_SHARE:
            logger.warning("%.2f%% of the target tokens are <unk> in the student's dictionary (%s): the student's "
                           "vocabulary misses much of what the set's targets say", 100 * share, self.bin_dir)
