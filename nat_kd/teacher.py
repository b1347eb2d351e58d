"""The teacher (or ensemble) that decodes a corpus: fairseq_plugins' loader, plus what decoding needs to know
(language pair, maximum positions) and a check of the data's dictionaries against the teacher's.

fairseq_plugins is imported first: it registers our architectures and lets fairseq's own loader read
checkpoints under torch >= 2.6 with ``weights_only`` kept on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import fairseq_plugins  # noqa: F401  (before any checkpoint is loaded)
from fairseq import utils
from fairseq.data import Dictionary
from fairseq_plugins.teachers import TeacherError, check_same_dictionary as check_dictionaries, load_teachers


@dataclass
class Teacher:
    paths: list[str]
    models: list
    task: object
    source_lang: str
    target_lang: str
    dict_dir: Path
    max_positions: tuple[int, int]  # (source, target) in tokens, EOS included
    arch: list[str] = field(default_factory=list)

    @property
    def src_dict(self) -> Dictionary:
        return self.task.source_dictionary

    @property
    def tgt_dict(self) -> Dictionary:
        return self.task.target_dictionary

    def describe(self) -> dict:
        return {"checkpoints": [str(Path(p).resolve()) for p in self.paths], "arch": self.arch,
                "dictionary_dir": str(self.dict_dir), "source_lang": self.source_lang,
                "target_lang": self.target_lang, "dictionary_size": len(self.tgt_dict),
                "max_positions": list(self.max_positions)}


def load_teacher(paths: list[str], dict_dir: str | os.PathLike | None = None) -> Teacher:
    """Load every checkpoint in ``paths`` as one ensemble; the dictionaries come from ``dict_dir``, else from
    the data folder the teacher was trained on."""
    models, task, dict_path, archs = load_teachers(list(paths), dict_dir, flags=("--teacher", "--dict-dir"))
    max_positions = utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in models])
    return Teacher(list(paths), list(models), task, task.cfg.source_lang, task.cfg.target_lang, dict_path,
                   tuple(max_positions), archs)


def check_same_dictionary(teacher: Teacher, data_dir: Path) -> None:
    """The binarized corpus must use the teacher's dictionaries, symbol for symbol (same size is not enough)."""
    for lang, expected in ((teacher.source_lang, teacher.src_dict), (teacher.target_lang, teacher.tgt_dict)):
        path = data_dir / f"dict.{lang}.txt"
        if not path.is_file():
            raise TeacherError(f"{data_dir} has no dict.{lang}.txt; is it fairseq-preprocess output for "
                               f"{teacher.source_lang}-{teacher.target_lang}?")
        check_dictionaries("source" if lang == teacher.source_lang else "target", expected,
                           Dictionary.load(str(path)), teacher.paths[0], path, "the data's")
