"""The teacher: one checkpoint or an ensemble, loaded with its dictionaries, with errors that say what to do.

``TeacherEnsemble`` is the one teacher concept of the toolkit: the word-KD criteria run it with teacher
forcing, ``nat_kd.teacher_topk`` stores its top-k, ``nat_kd.generate_distilled`` decodes a corpus with it.
On every command line its checkpoints are ``--teacher-path A.pt[:B.pt...]`` (fairseq's convention for
ensembles) and the folder with its dictionaries ``--teacher-data DIR``.

Checkpoints are read only through fairseq's own loaders, after checkpoint_safety has allow-listed what
fairseq checkpoints hold (so torch's ``weights_only`` stays on).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

import fairseq_plugins.checkpoint_safety  # noqa: F401  (before any checkpoint is loaded)

CHECKPOINT_FLAG, DICTIONARY_FLAG = "--teacher-path", "--teacher-data"


class TeacherError(ValueError):
    """A teacher (or its top-k files) that cannot be used here: the message names the file and the fix.

    The base of the plugin's errors; it cannot derive from ``nat_kd.errors.NatKdError`` because the plugin
    does not import nat_kd, and nat_kd's command lines treat both as the toolkit's own errors."""


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


def read_checkpoint(file: str, flag: str = CHECKPOINT_FLAG) -> dict:
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


@dataclass
class TeacherEnsemble:
    """One or more teacher checkpoints that share a language pair and dictionaries.

    A plain object, not an nn.Module: a criterion holding it keeps the teachers out of its own parameters
    and state_dict, so fairseq neither saves them in the student's checkpoints nor hands them to the optimizer.
    """

    paths: list[str]
    models: tuple  # eval mode, parameters as fairseq loads them (see load)
    task: object  # fairseq task of the first checkpoint, holding the dictionaries
    dict_dir: Path  # where the dictionaries were read
    archs: list[str]
    config: object = None  # the first checkpoint's fairseq configuration (its bpe/tokenizer sections, ...)

    @classmethod
    def load(cls, paths, dict_dir=None, flags: tuple[str, str] = (CHECKPOINT_FLAG, DICTIONARY_FLAG)):
        """Load every checkpoint in ``paths`` (a list, or ``a.pt:b.pt``) in eval mode, on the CPU.

        Parameters keep ``requires_grad`` as fairseq-generate has them: with frozen parameters torch's
        matmul turns the output projection of fairseq's strided last-step features into one matrix-vector
        product per hypothesis instead of one GEMM, and beam search slows down (docs/results/generator_speed.md).
        Callers that train beside a teacher freeze it themselves (``freeze``).

        Dictionaries come from ``dict_dir``, else from the data folder recorded in each checkpoint; every member
        must use the first one's. ``flags`` name the caller's options for the checkpoints and the dictionary
        folder, for the error messages.
        """
        from fairseq import checkpoint_utils

        files = split_paths(paths)
        if not files:
            raise TeacherError(f"no teacher checkpoint given: pass {flags[0]} CHECKPOINT")
        models, archs, first_task, first_dir, first_cfg = [], [], None, None, None
        for file in files:
            state = read_checkpoint(file, flags[0])
            cfg = _config(state, file)
            data = Path(dict_dir) if dict_dir else Path(str(cfg.task.data).split(os.pathsep)[0])
            task = _setup_task(cfg, data, file, flags[1])
            if first_task is None:
                first_task, first_dir, first_cfg = task, data, cfg
            pair = (task.cfg.source_lang, task.cfg.target_lang)
            first_pair = (first_task.cfg.source_lang, first_task.cfg.target_lang)
            if pair != first_pair:
                raise TeacherError(f"ensemble members translate different pairs: {files[0]} {first_pair}, {file} {pair}")
            for kind, mine, theirs in (("source", task.source_dictionary, first_task.source_dictionary),
                                       ("target", task.target_dictionary, first_task.target_dictionary)):
                check_same_dictionary(kind, mine, theirs, file, files[0], "the first ensemble member's")
            for side, lang, dictionary in (("encoder", pair[0], task.source_dictionary),
                                           ("decoder", pair[1], task.target_dictionary)):
                weight = state["model"].get(f"{side}.embed_tokens.weight")
                if weight is not None and weight.shape[0] != len(dictionary):
                    raise TeacherError(
                        f"dictionary {data / f'dict.{lang}.txt'} has {len(dictionary)} entries but teacher {file} "
                        f"has {weight.shape[0]} {side} embeddings: it was trained with another dictionary; pass "
                        f"{flags[1]} with the teacher's own")
            loaded, _, _ = checkpoint_utils.load_model_ensemble_and_task([file], task=first_task, state=state)
            for model in loaded:
                model.eval()
            models += loaded
            archs.append(getattr(cfg.model, "_name", None) or str(getattr(cfg.model, "arch", "?")))
        return cls(files, tuple(models), first_task, first_dir, archs, first_cfg)

    @property
    def source_lang(self) -> str:
        return self.task.cfg.source_lang

    @property
    def target_lang(self) -> str:
        return self.task.cfg.target_lang

    @property
    def src_dict(self):
        return self.task.source_dictionary

    @property
    def tgt_dict(self):
        return self.task.target_dictionary

    @property
    def max_positions(self) -> tuple[int, int]:
        """(source, target) in tokens, EOS included: what the task and every member accept."""
        from fairseq import utils

        return tuple(utils.resolve_max_positions(self.task.max_positions(),
                                                 *[m.max_positions() for m in self.models]))

    def describe(self) -> dict:
        return {"checkpoints": [str(Path(p).resolve()) for p in self.paths], "arch": self.archs,
                "dictionary_dir": str(self.dict_dir), "source_lang": self.source_lang,
                "target_lang": self.target_lang, "dictionary_size": len(self.tgt_dict),
                "max_positions": list(self.max_positions)}

    def check_dictionaries(self, src_dict, tgt_dict, where, whose: str = "the student's") -> None:
        """The data (or student) at ``where`` must use the teacher's dictionaries, symbol for symbol."""
        for kind, mine, theirs in (("source", self.src_dict, src_dict), ("target", self.tgt_dict, tgt_dict)):
            check_same_dictionary(kind, mine, theirs, self.paths[0], where, whose)

    def check_data_folder(self, data_dir: Path) -> None:
        """A fairseq-binarized folder (its dict.LANG.txt) must use the teacher's dictionaries."""
        from fairseq.data import Dictionary

        for kind, lang, mine in (("source", self.source_lang, self.src_dict),
                                 ("target", self.target_lang, self.tgt_dict)):
            path = Path(data_dir) / f"dict.{lang}.txt"
            if not path.is_file():
                raise TeacherError(f"{data_dir} has no dict.{lang}.txt; is it fairseq-preprocess output for "
                                   f"{self.source_lang}-{self.target_lang}?")
            check_same_dictionary(kind, mine, Dictionary.load(str(path)), self.paths[0], path, "the data's")

    def to(self, device, dtype=None) -> TeacherEnsemble:
        """Every member on ``device`` (and float type ``dtype``, if given)."""
        for model in self.models:
            model.to(device=device, dtype=dtype)
        return self

    def freeze(self) -> TeacherEnsemble:
        for model in self.models:
            model.requires_grad_(False)
        return self

    @torch.no_grad()
    def log_probs(self, src_tokens, src_lengths, prev_output_tokens) -> torch.Tensor:
        """Teacher-forced log-probabilities B x T x V at temperature 1; an ensemble averages probabilities."""
        per_model = []
        for model in self.models:
            model.eval()
            net_output = model(src_tokens=src_tokens, src_lengths=src_lengths, prev_output_tokens=prev_output_tokens)
            per_model.append(model.get_normalized_probs(net_output, log_probs=True).float())
        if len(per_model) == 1:
            return per_model[0]
        return torch.logsumexp(torch.stack(per_model), dim=0) - math.log(len(per_model))
