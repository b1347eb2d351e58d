"""Teachers in word-level KD: checked against the student, placed on its device, run with teacher forcing.

The teachers (loaded by fairseq_plugins.teachers) are kept OUT of the criterion's module tree (a plain tuple,
not a submodule), so that ``criterion.state_dict()``/``parameters()`` stay empty: fairseq then neither saves
them in the student's checkpoints nor hands them to the optimizer.
"""
from __future__ import annotations

import math

import torch

from fairseq_plugins.teachers import check_same_dictionary


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
