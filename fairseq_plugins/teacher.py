"""Load teacher checkpoints (one, or an ensemble) with their dictionaries, with errors that say what
to do. One loader for everything that uses a teacher: the word-KD criteria, nat_kd.teacher_topk and
nat_kd.generate_distilled.

Checkpoints are read only through fairseq's own loaders, after checkpoint_safety has allow-listed what
fairseq checkpoints hold (so torch's ``weights_only`` stays on).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import fairseq_plugins.checkpoint_safety  # noqa: F401  (before any checkpoint is loaded)


class TeacherError(ValueError):
    """A teacher that cannot be used here: the message names the file and the fix."""


class Teachers(NamedTuple):
    models: tuple  # eval mode, on the CPU, parameters as fairseq loads them (see load_teachers)
    task: object  # fairseq task of the first checkpoint, holding the dictionaries
    dict_dir: Path  # where the dictionaries were read
    archs: list[str]


def split_paths(paths: str | list[str] | None) -> list[str]:
    """``a.pt:b.pt`` -> ['a.pt', 'b.pt'] (fairseq's convention for ensembles); a list stays as it is."""
    if isinstance(paths, (list, tuple)):
        return [str(p) for p in paths]
    return [p for p in (paths or "").split(":") if p]


def check_same_dictionary(kind: str, teacher_dict, other_dict, teacher_file, other_where,
                          other_name: str = "the student's") -> None:
    """Teachers and their data (or students) must share the very same dictionary, symbol for symbol: the same
    size is not enough, ids would silently mean other words."""
    if teacher_dict.symbols == other_dict.symbols:
        return
    first = next((i for i, (a, b) in enumerate(zip(teacher_dict.symbols, other_dict.symbols)) if a != b),
                 min(len(teacher_dict), len(other_dict)))
    teacher_sym = teacher_dict.symbols[first] if first < len(teacher_dict) else "<none>"
    other_sym = other_dict.symbols[first] if first < len(other_dict) else "<none>"
    raise TeacherError(
        f"the {kind} dictionary of teacher {teacher_file} ({len(teacher_dict)} entries) differs from "
        f"{other_name} ({other_where}, {len(other_dict)} entries): first difference at index {first} "
        f"({teacher_sym!r} vs {other_sym!r}). Binarize the data with the teacher's dictionaries "
        "(fairseq-preprocess --srcdict/--tgtdict TEACHER_DATA/dict.*.txt), or use a teacher trained on them."
    )


def read_checkpoint(file: str, flag: str = "--teacher-path") -> dict:
    from fairseq import checkpoint_utils

    path = Path(file)
    if not path.is_file():
        raise TeacherError(f"teacher checkpoint {path} does not exist: check {flag} (train the teacher first; "
                           "e.g. scripts/main.sh writes runs/multi30k.SRC-TGT/teacher_tiny/checkpoint_best.pt)")
    if not os.access(path, os.R_OK):
        raise TeacherError(f"teacher checkpoint {path} is not readable; check its permissions")
    try:
        return checkpoint_utils.load_checkpoint_to_cpu(str(path))
    except Exception as err:  # truncated file, not a checkpoint, or an unsafe pickle refused by torch
        raise TeacherError(f"cannot load teacher checkpoint {path}: {type(err).__name__}: {str(err)[:300]}; "
                           "is it a complete fairseq checkpoint?") from None


def _config(state: dict, file: str):
    cfg = state.get("cfg")
    if cfg is None and state.get("args") is not None:
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf
        cfg = convert_namespace_to_omegaconf(state["args"])
    if cfg is None:
        raise TeacherError(f"{file} holds no fairseq configuration; is it a fairseq checkpoint?")
    return cfg


def _setup_task(cfg, dict_dir: Path, file: str, dict_flag: str):
    from fairseq import tasks
    from omegaconf import open_dict

    if not dict_dir.is_dir():
        raise TeacherError(f"teacher {file} was trained on data folder {dict_dir}, which does not exist here: "
                           f"pass {dict_flag} DIR with the teacher's dict.SRC.txt and dict.TGT.txt")
    with open_dict(cfg):
        cfg.task.data = str(dict_dir)
    try:
        return tasks.setup_task(cfg.task, from_checkpoint=True)
    except Exception as err:
        raise TeacherError(f"cannot read the dictionaries of teacher {file} from {dict_dir} ({type(err).__name__}: "
                           f"{str(err)[:200]}); pass {dict_flag} with the fairseq-preprocess folder the teacher "
                           "was trained on (dict.SRC.txt, dict.TGT.txt)") from None


def load_teachers(paths, dict_dir=None, flags: tuple[str, str] = ("--teacher-path", "--teacher-data")) -> Teachers:
    """Load every checkpoint in ``paths`` (a list, or ``a.pt:b.pt``) in eval mode, as one ensemble.

    Parameters keep ``requires_grad`` as fairseq-generate has them: freezing them makes beam search about
    1.6x slower on the CPU. torch's matmul folds fairseq's last-step features (a strided B x 1 x D slice)
    into one GEMM only when a grad is required; for a frozen output projection it runs one matrix-vector
    product per hypothesis instead. Callers that train beside a teacher freeze it themselves.

    Dictionaries come from ``dict_dir``, else from the data folder recorded in each checkpoint; every member
    must use the first one's. ``flags`` name the caller's options for the checkpoints and the dictionary
    folder, for the error messages.
    """
    from fairseq import checkpoint_utils

    files = split_paths(paths)
    if not files:
        raise TeacherError(f"no teacher checkpoint given: pass {flags[0]} CHECKPOINT")
    models, archs, first = [], [], None
    for file in files:
        state = read_checkpoint(file, flags[0])
        cfg = _config(state, file)
        data = Path(dict_dir) if dict_dir else Path(str(cfg.task.data).split(os.pathsep)[0])
        task = _setup_task(cfg, data, file, flags[1])
        if first is None:
            first = Teachers((), task, data, [])
        pair, first_pair = (task.cfg.source_lang, task.cfg.target_lang), (first.task.cfg.source_lang,
                                                                          first.task.cfg.target_lang)
        if pair != first_pair:
            raise TeacherError(f"ensemble members translate different pairs: {files[0]} {first_pair}, {file} {pair}")
        for kind, mine, theirs in (("source", task.source_dictionary, first.task.source_dictionary),
                                   ("target", task.target_dictionary, first.task.target_dictionary)):
            check_same_dictionary(kind, mine, theirs, file, files[0], "the first ensemble member's")
        for side, lang, dictionary in (("encoder", pair[0], task.source_dictionary),
                                       ("decoder", pair[1], task.target_dictionary)):
            weight = state["model"].get(f"{side}.embed_tokens.weight")
            if weight is not None and weight.shape[0] != len(dictionary):
                raise TeacherError(
                    f"dictionary {data / f'dict.{lang}.txt'} has {len(dictionary)} entries but teacher {file} "
                    f"has {weight.shape[0]} {side} embeddings: it was trained with another dictionary; pass "
                    f"{flags[1]} with the teacher's own")
        loaded, _, _ = checkpoint_utils.load_model_ensemble_and_task([file], task=first.task, state=state)
        for model in loaded:
            model.eval()
        models += loaded
        archs.append(getattr(cfg.model, "_name", None) or str(getattr(cfg.model, "arch", "?")))
    return Teachers(tuple(models), first.task, first.dict_dir, archs)
