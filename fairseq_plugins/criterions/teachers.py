"""Frozen teachers for word-level KD: loading (with clear errors), dictionary checks, teacher forcing.

The teachers are kept OUT of the criterion's module tree (a plain tuple, not a submodule), so that
``criterion.state_dict()``/``parameters()`` stay empty: fairseq then neither saves them in the student's
checkpoints nor hands them to the optimizer. Checkpoints are read only through fairseq's own loaders, after
``fairseq_plugins`` has been imported (see checkpoint_safety).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from omegaconf import open_dict

import fairseq_plugins.checkpoint_safety  # noqa: F401  (allow-lists fairseq's checkpoint contents)


class TeacherError(ValueError):
    """A teacher that cannot be used with this student: the message names the file and the fix."""


def split_paths(paths: str) -> list[str]:
    """``a.pt:b.pt`` -> ['a.pt', 'b.pt'] (fairseq's convention for ensembles)."""
    return [p for p in (paths or "").split(":") if p]


def check_same_dictionary(kind: str, teacher_dict, student_dict, teacher_file, student_where) -> None:
    """Word-level KD compares distributions index by index, so both sides must use the very same dictionary."""
    if teacher_dict.symbols == student_dict.symbols:
        return
    first = next((i for i, (a, b) in enumerate(zip(teacher_dict.symbols, student_dict.symbols)) if a != b),
                 min(len(teacher_dict), len(student_dict)))
    teacher_sym = teacher_dict.symbols[first] if first < len(teacher_dict) else "<none>"
    student_sym = student_dict.symbols[first] if first < len(student_dict) else "<none>"
    raise TeacherError(
        f"the {kind} dictionary of teacher {teacher_file} ({len(teacher_dict)} entries) differs from the "
        f"student's ({student_where}, {len(student_dict)} entries): first difference at index {first} "
        f"({teacher_sym!r} vs {student_sym!r}). Binarize the student's data with the teacher's dictionaries "
        "(fairseq-preprocess --srcdict/--tgtdict TEACHER_DATA/dict.*.txt), or use a teacher trained on them."
    )


def load_teachers(paths: str, teacher_data: str | None = None):
    """Load the teacher checkpoint(s) frozen and in eval mode; returns (models, task of the first teacher).

    ``teacher_data``: folder with the teachers' dict.*.txt; default: the data folder recorded in each checkpoint.
    """
    from fairseq import checkpoint_utils

    files = split_paths(paths)
    if not files:
        raise TeacherError("no teacher given: pass --teacher-path CHECKPOINT[:CHECKPOINT...] "
                           "(or --teacher-topk-path for offline mode)")
    models, first_task = [], None
    for file in files:
        if not Path(file).is_file():
            raise TeacherError(f"teacher checkpoint {file} does not exist: check --teacher-path "
                               "(train the teacher first, e.g. scripts/main.sh writes "
                               "runs/multi30k.SRC-TGT/teacher_tiny/checkpoint_best.pt)")
        state = checkpoint_utils.load_checkpoint_to_cpu(file)
        cfg = state["cfg"]
        data = teacher_data or cfg.task.data
        if not Path(str(data).split(":")[0]).is_dir():
            raise TeacherError(f"teacher {file} was trained on data folder {data}, which does not exist here: "
                               "pass --teacher-data DIR with the teacher's dict.SRC.txt and dict.TGT.txt")
        with open_dict(cfg):
            cfg.task.data = str(data)
        (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([file], state=state)
        if getattr(model.decoder, "adaptive_softmax", None) is not None:
            raise TeacherError(f"teacher {file} uses an adaptive softmax, which word-level KD does not support")
        model.eval()
        model.requires_grad_(False)
        if first_task is None:
            first_task = task
        else:
            check_same_dictionary("target", task.target_dictionary, first_task.target_dictionary, file, files[0])
        models.append(model)
    return tuple(models), first_task


def check_teacher_matches_student(teacher_task, student_task, teacher_paths: str) -> None:
    where = f"data {getattr(student_task.cfg, 'data', '?')}"
    check_same_dictionary("source", teacher_task.source_dictionary, student_task.source_dictionary,
                          teacher_paths, where)
    check_same_dictionary("target", teacher_task.target_dictionary, student_task.target_dictionary,
                          teacher_paths, where)


def move_teachers(models, like: torch.Tensor):
    """Put the teachers on the student's device and float type (done lazily: fairseq moves only the model)."""
    for model in models:
        model.to(device=like.device, dtype=like.dtype if like.is_floating_point() else None)
    return models


@torch.no_grad()
def teacher_log_probs(models, src_tokens, src_lengths, prev_output_tokens) -> torch.Tensor:
    """Teacher-forced log-probabilities B x T x V at temperature 1; an ensemble averages probabilities."""
    per_model = []
    for model in models:
        model.eval()
        net_output = model(src_tokens=src_tokens, src_lengths=src_lengths, prev_output_tokens=prev_output_tokens)
        per_model.append(model.get_normalized_probs(net_output, log_probs=True).float())
    if len(per_model) == 1:
        return per_model[0]
    return torch.logsumexp(torch.stack(per_model), dim=0) - math.log(len(per_model))
