"""Word-level knowledge distillation (Hinton et al. 2015; Kim & Rush 2016's Word-KD) for AT students.

    L = alpha * CE_ls(student, reference) + (1 - alpha) * T^2 * KL(softmax(z_t / T) || softmax(z_s / T))

summed over the non-padding target tokens (fairseq's usual per-token normalisation follows). CE_ls is
fairseq's ``label_smoothed_nll_loss``. The teacher is scored with teacher forcing on the same batch, either
online (``--teacher-path``, frozen checkpoint(s) on the student's device) or offline from precomputed top-k
log-probabilities (``--teacher-topk-path``, see nat_kd.teacher_topk). An ensemble's distribution is the
average of its members' probabilities; the temperature is applied to the log of that average, which for a
single teacher is exactly softmax(z_t / T) and keeps offline == online.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
    label_smoothed_nll_loss,
)
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from fairseq_plugins.teacher import TeacherEnsemble, TeacherError

from .topk import TeacherTopK


@dataclass
class WordKDFields(FairseqDataclass):
    teacher_path: str = field(default="", metadata={
        "help": "teacher checkpoint(s) for online KD, colon-separated for an ensemble (probabilities averaged)"})
    teacher_data: Optional[str] = field(default=None, metadata={
        "help": "folder with the teacher's dict.*.txt (default: the data folder recorded in its checkpoint)"})
    teacher_topk_path: Optional[str] = field(default=None, metadata={
        "help": "offline KD: folder written by `python -m nat_kd.teacher_topk`; used instead of running the "
                "teacher (for validation too when it holds a 'valid' split)"})
    kd_alpha: float = field(default=0.5, metadata={
        "help": "weight of the hard loss on the reference; the soft (teacher) loss gets 1 - alpha"})
    kd_temperature: float = field(default=1.0, metadata={
        "help": "temperature T softening both distributions; the soft loss is scaled by T^2"})


@dataclass
class WordKDConfig(LabelSmoothedCrossEntropyCriterionConfig, WordKDFields):
    pass


def soft_kl(student_logits, teacher_lprobs, temperature: float, teacher_index=None) -> torch.Tensor:
    """Per row KL(q || p), q = softmax(teacher_lprobs / T), p = softmax(student_logits / T).

    ``teacher_lprobs``: N x V over the whole vocabulary, or N x k over the tokens ``teacher_index`` (N x k,
    a top-k): q is then renormalised over those k tokens and p read at them.
    """
    student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    if teacher_index is not None:
        student = student.gather(-1, teacher_index)
    teacher = F.log_softmax(teacher_lprobs.float() / temperature, dim=-1)
    return (teacher.exp() * (teacher - student)).sum(-1)


def teacher_top1(teacher_lprobs, teacher_index=None) -> torch.Tensor:
    best = teacher_lprobs.argmax(-1, keepdim=True)
    return (best if teacher_index is None else teacher_index.gather(-1, best)).squeeze(-1)


def word_kd_loss(student_logits, target, teacher_lprobs, alpha: float, temperature: float, epsilon: float,
                 teacher_index=None) -> dict:
    """Word-KD on N target tokens (padding already removed); every value is a sum over the N tokens.

    Returns loss, hard (label-smoothed CE), nll (plain CE), soft (T^2 * KL) and agree (student top-1 ==
    teacher top-1 count).
    """
    lprobs = F.log_softmax(student_logits.float(), dim=-1)
    hard, nll = label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=None, reduce=True)
    soft = temperature ** 2 * soft_kl(student_logits, teacher_lprobs, temperature, teacher_index).sum()
    agree = (student_logits.argmax(-1) == teacher_top1(teacher_lprobs, teacher_index)).sum()
    return {"loss": alpha * hard + (1.0 - alpha) * soft, "hard": hard, "nll": nll, "soft": soft, "agree": agree}


class TeacherSource:
    """Where the teacher's distributions come from: a frozen online teacher, or offline top-k files.

    A plain object, not an nn.Module: nothing here becomes a parameter or buffer of the criterion.
    """

    def __init__(self, cfg, task):
        if not 0.0 <= cfg.kd_alpha <= 1.0:
            raise TeacherError(f"--kd-alpha {cfg.kd_alpha}: must lie in [0, 1]")
        if cfg.kd_temperature <= 0:
            raise TeacherError(f"--kd-temperature {cfg.kd_temperature}: must be positive")
        if not cfg.teacher_path and not cfg.teacher_topk_path:
            raise TeacherError("word-level KD needs a teacher: pass --teacher-path CHECKPOINT[:CHECKPOINT...] "
                               "(online) or --teacher-topk-path DIR from python -m nat_kd.teacher_topk (offline)")
        self.topk = None
        if cfg.teacher_topk_path:
            self.topk = TeacherTopK(cfg.teacher_topk_path)
            self.topk.check_dictionary(task.target_dictionary)
        self.ensemble = None
        if cfg.teacher_path:
            ensemble = TeacherEnsemble.load(cfg.teacher_path, cfg.teacher_data)
            for model, file in zip(ensemble.models, ensemble.paths):
                if getattr(model.decoder, "adaptive_softmax", None) is not None:
                    raise TeacherError(f"teacher {file} uses an adaptive softmax, which word-level KD does not "
                                       "support (it needs the full distribution)")
            ensemble.check_dictionaries(task.source_dictionary, task.target_dictionary,
                                        f"data {getattr(task.cfg, 'data', '?')}")
            self.ensemble = ensemble.freeze()  # nothing may ever update a teacher
        self._placed = None

    def distributions(self, sample_ids, src_tokens, src_lengths, prev_output_tokens, target, pad: int,
                      training: bool, like: torch.Tensor):
        """Teacher log-probabilities B x L x K for an AT-style (teacher-forced) batch, and the token ids
        B x L x K they belong to (None when K is the whole vocabulary). Offline mode reads the 'train' rows
        while training and 'valid' rows in evaluation; without a 'valid' split, validation runs online."""
        split = "train" if training else "valid"
        if self.topk is not None and (training or self.topk.has_split(split) or self.ensemble is None):
            mask = target.ne(pad)
            index, lprobs = self.topk.lookup(split, sample_ids.cpu().numpy(), mask.sum(1).cpu().numpy())
            dense_lprobs = like.new_zeros((*target.shape, self.topk.k), dtype=torch.float32)
            dense_index = torch.zeros((*target.shape, self.topk.k), dtype=torch.long, device=like.device)
            dense_lprobs[mask] = torch.from_numpy(lprobs).to(like.device)
            dense_index[mask] = torch.from_numpy(index).to(like.device)
            return dense_lprobs, dense_index
        placement = (like.device, like.dtype)
        if self._placed != placement:  # lazily: fairseq moves only the student
            self.ensemble.to(like.device, like.dtype if like.is_floating_point() else None)
            self._placed = placement
        return self.ensemble.log_probs(src_tokens, src_lengths, prev_output_tokens), None


@register_criterion("word_kd", dataclass=WordKDConfig)
class WordKDCriterion(LabelSmoothedCrossEntropyCriterion):
    """Word-level KD for autoregressive students (fairseq ``translation`` task)."""

    def __init__(self, cfg: WordKDConfig, task):
        super().__init__(task, cfg.sentence_avg, cfg.label_smoothing, cfg.ignore_prefix_size, cfg.report_accuracy)
        if cfg.ignore_prefix_size:
            raise TeacherError("word_kd does not support --ignore-prefix-size")
        self.alpha, self.temperature = cfg.kd_alpha, cfg.kd_temperature
        self.teacher = TeacherSource(cfg, task)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        if getattr(model.decoder, "adaptive_softmax", None) is not None:
            raise TeacherError("word_kd does not support students with an adaptive softmax")
        target = model.get_targets(sample, net_output)
        net_input = sample["net_input"]
        logits = net_output[0]
        teacher_lprobs, teacher_index = self.teacher.distributions(
            sample["id"], net_input["src_tokens"], net_input["src_lengths"], net_input["prev_output_tokens"],
            target, self.padding_idx, model.training, logits)
        mask = target.ne(self.padding_idx)
        losses = word_kd_loss(logits[mask], target[mask], teacher_lprobs[mask], self.alpha, self.temperature,
                              self.eps, None if teacher_index is None else teacher_index[mask])
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": losses["loss"].data,
            "nll_loss": losses["nll"].data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "kd_hard": losses["hard"].data,
            "kd_soft": losses["soft"].data,
            "kd_agree": utils.item(losses["agree"]),
            "kd_tokens": utils.item(mask.sum()),
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return losses["loss"], sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key, name in (("kd_hard", "hard_loss"), ("kd_soft", "soft_loss")):
            value = sum(log.get(key, 0) for log in logging_outputs)
            metrics.log_scalar(name, value / max(sample_size, 1) / math.log(2), sample_size, round=3)
        log_agreement(logging_outputs)


def log_agreement(logging_outputs) -> None:
    """Student/teacher top-1 agreement in percent over the target tokens where the soft loss applies."""
    tokens = sum(log.get("kd_tokens", 0) for log in logging_outputs)
    agree = sum(log.get("kd_agree", 0) for log in logging_outputs)
    metrics.log_scalar("kd_agree", agree, round=0)
    metrics.log_scalar("kd_tokens", tokens, round=0)
    metrics.log_derived("teacher_agreement", lambda meters: round(
        100.0 * meters["kd_agree"].sum / meters["kd_tokens"].sum, 2) if meters["kd_tokens"].sum > 0 else float("nan"))
