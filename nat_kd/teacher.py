"""Load a teacher checkpoint (or an ensemble) with its dictionaries, and check them against the data.

fairseq_plugins is imported first: it registers our architectures and lets fairseq's own loader read
checkpoints under torch >= 2.6 with ``weights_only`` kept on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import fairseq_plugins  # noqa: F401  (before any checkpoint is loaded)
from fairseq import checkpoint_utils, utils
from fairseq.data import Dictionary


class TeacherError(ValueError):
    """A checkpoint or dictionary problem; the message names the file and the fix."""


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


def _read_checkpoint(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise TeacherError(f"teacher checkpoint {file} does not exist; pass the checkpoint_best.pt that "
                           "fairseq-train wrote (--path)")
    if not os.access(file, os.R_OK):
        raise TeacherError(f"teacher checkpoint {file} is not readable; check its permissions")
    try:
        return checkpoint_utils.load_checkpoint_to_cpu(str(file))
    except Exception as err:  # truncated file, not a checkpoint, or an unsafe pickle refused by torch
        raise TeacherError(f"cannot load teacher checkpoint {file}: {type(err).__name__}: {str(err)[:300]}; "
                           "is it a complete fairseq checkpoint?") from None


def _config(state: dict, path: str):
    cfg = state.get("cfg")
    if cfg is None and state.get("args") is not None:
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf
        cfg = convert_namespace_to_omegaconf(state["args"])
    if cfg is None:
        raise TeacherError(f"{path} holds no fairseq configuration; is it a fairseq checkpoint?")
    return cfg


def _setup_task(cfg, dict_path: Path, checkpoint: str):
    """fairseq's task for the checkpoint, reading the dictionaries (and, if the checkpoint does not name the
    language pair, inferring it) from ``dict_path``."""
    from fairseq import tasks
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.task.data = str(dict_path)
    try:
        return tasks.setup_task(cfg.task, from_checkpoint=True)
    except (FileNotFoundError, OSError, Exception) as err:
        raise TeacherError(
            f"cannot read the dictionaries of teacher {checkpoint} from {dict_path} ({type(err).__name__}: "
            f"{str(err)[:200]}); pass --dict-dir with the fairseq-preprocess folder the teacher was trained on "
            "(dict.SRC.txt, dict.TGT.txt and its binarized files)") from None


def _embedding_rows(state: dict, prefix: str) -> int | None:
    weight = state["model"].get(f"{prefix}.embed_tokens.weight")
    return None if weight is None else int(weight.shape[0])


def load_teacher(paths: list[str], dict_dir: str | os.PathLike | None = None) -> Teacher:
    """Load every checkpoint in ``paths`` as one ensemble; the dictionaries come from ``dict_dir``, else from
    the data folder the (first) teacher was trained on."""
    if not paths:
        raise TeacherError("no teacher checkpoint given (--teacher PATH [PATH ...])")
    task, models, archs, langs, dict_path = None, [], [], None, None
    for path in paths:
        state = _read_checkpoint(path)
        cfg = _config(state, path)
        dict_path = Path(dict_dir) if dict_dir else Path(dict_path or cfg.task.data.split(os.pathsep)[0])
        if task is None:
            task = _setup_task(cfg, dict_path, path)
        pair = (task.cfg.source_lang, task.cfg.target_lang)
        if langs is not None and pair != langs:
            raise TeacherError(f"ensemble members translate different pairs: {paths[0]} {langs}, {path} {pair}")
        langs = pair
        for side, lang, dictionary in (("encoder", pair[0], task.source_dictionary),
                                       ("decoder", pair[1], task.target_dictionary)):
            rows = _embedding_rows(state, side)
            if rows is not None and rows != len(dictionary):
                raise TeacherError(
                    f"dictionary {dict_path / f'dict.{lang}.txt'} has {len(dictionary)} entries but the teacher "
                    f"{path} has {rows} {side} embeddings: it was trained with another dictionary; pass "
                    "--dict-dir with the teacher's own")
        loaded, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides={"data": str(dict_path)}, task=task, state=state)
        models += loaded
        archs.append(cfg.model._name if hasattr(cfg.model, "_name") else str(getattr(cfg.model, "arch", "?")))
    for model in models:
        model.eval()
    max_positions = utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in models])
    return Teacher(list(paths), models, task, langs[0], langs[1], dict_path, tuple(max_positions), archs)


def check_same_dictionary(teacher: Teacher, data_dir: Path) -> None:
    """The binarized corpus must use the teacher's dictionaries, symbol for symbol (same size is not enough)."""
    for lang, expected in ((teacher.source_lang, teacher.src_dict), (teacher.target_lang, teacher.tgt_dict)):
        path = data_dir / f"dict.{lang}.txt"
        if not path.is_file():
            raise TeacherError(f"{data_dir} has no dict.{lang}.txt; is it fairseq-preprocess output for "
                               f"{teacher.source_lang}-{teacher.target_lang}?")
        found = Dictionary.load(str(path))
        if found.symbols != expected.symbols:
            diff = next((i for i, (a, b) in enumerate(zip(found.symbols, expected.symbols)) if a != b),
                        min(len(found), len(expected)))
            raise TeacherError(
                f"dictionary {path} ({len(found)} entries) differs from the teacher's "
                f"{teacher.dict_dir / f'dict.{lang}.txt'} ({len(expected)} entries) from entry {diff}: the data "
                "was binarized with another dictionary. Re-binarize it with fairseq-preprocess --srcdict/--tgtdict "
                "of the teacher's dictionaries, or give the raw text (--source) instead")
