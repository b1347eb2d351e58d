"""Word-level KD for NAT students: fairseq's NAT losses, plus the teacher's distributions as soft targets.

For a NAT trained on a reference y, the AT teacher's distribution at target position j is
p_teacher(. | y_<j, x) (teacher forcing on the same reference). The NAT's word-insertion loss on the
reference gets weight alpha and the soft loss (1 - alpha) * T^2 * mean KL over the positions where the
NAT predicts a reference token (its own ``word_ins`` mask, e.g. only the masked tokens for CMLM, every
refinement step for the iterative NAT); the
length loss and any other NAT loss keep their usual weights. Defined for students whose ``word_ins``
output is aligned with the reference tokens (vanilla NAT, iterative NAT, CMLM, Levenshtein, GLAT); the
insertion transformer's slot-based targets are not, nor are CTC's and the DA-Transformer's losses over every
alignment, and those students are refused.

fairseq's ``translation_lev`` task prepends <s> to source and target; the AT teacher never saw it, so it
is removed before teacher forcing, and the NAT's <s> position gets no soft loss.
"""

from dataclasses import dataclass

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.nat_loss import LabelSmoothedDualImitationCriterion, LabelSmoothedDualImitationCriterionConfig

from fairseq_plugins.teacher import TeacherError
from .word_kd import TeacherSource, WordKDFields, log_agreement, soft_kl, teacher_top1


@dataclass
class NATWordKDConfig(LabelSmoothedDualImitationCriterionConfig, WordKDFields):
    pass


def at_inputs_from_nat_sample(sample, bos: int, eos: int, pad: int):
    """(src_tokens, src_lengths, prev_output_tokens, target) as fairseq's ``translation`` task would batch the
    same sentences for the AT teacher: without the <s> that ``translation_lev`` prepends."""
    src = sample["net_input"]["src_tokens"]
    target = sample["target"]
    if not target[:, 0].eq(bos).all():
        raise TeacherError("nat_word_kd expects targets starting with <s> (fairseq's translation_lev task)")
    # right-padded sources have <s> in column 0; left-padded ones have it after their padding, and column 0
    # holds only <s> or padding: turn <s> into padding and drop that column
    if not src[:, 0].eq(bos).all():
        src = src.masked_fill(src.eq(bos), pad)
    src = src[:, 1:]
    at_target = target[:, 1:]
    prev = at_target.masked_fill(at_target.eq(eos), pad).roll(1, dims=1)
    prev[:, 0] = eos
    return src, src.ne(pad).sum(1), prev, at_target


class _AlphaWeightedStudent:
    """Calls the student for fairseq's NAT criterion, weighting its word-insertion loss by alpha through
    fairseq's own per-output ``factor``, and keeps the outputs for the soft loss."""

    def __init__(self, model, alpha: float):
        self.model, self.alpha, self.outputs = model, alpha, None

    def __call__(self, *args, **kwargs):
        outputs = self.model(*args, **kwargs)
        word_ins = outputs.get("word_ins")
        if word_ins is None or word_ins.get("out") is None or word_ins["tgt"].dim() != 2:
            raise TeacherError(f"nat_word_kd: {type(self.model).__name__} has no word_ins output aligned with the "
                               "reference tokens (the insertion transformer predicts slots; CTC and the "
                               "DA-Transformer score every alignment of the reference); word-level KD is undefined "
                               "for it: train it with nat_loss on distilled data")
        word_ins["factor"] = word_ins.get("factor", 1.0) * self.alpha
        self.outputs = outputs
        return outputs


@register_criterion("nat_word_kd", dataclass=NATWordKDConfig)
class NATWordKDCriterion(LabelSmoothedDualImitationCriterion):
    """fairseq's ``nat_loss`` with the word-insertion loss mixed with an AT teacher's soft targets."""

    def __init__(self, cfg: NATWordKDConfig, task):
        super().__init__(task, cfg.label_smoothing)
        self.alpha, self.temperature = cfg.kd_alpha, cfg.kd_temperature
        self.teacher = TeacherSource(cfg, task)
        dictionary = task.target_dictionary
        self.bos, self.eos = dictionary.bos(), dictionary.eos()

    def forward(self, model, sample, reduce=True):
        student = _AlphaWeightedStudent(model, self.alpha)
        loss, sample_size, logging_output = super().forward(student, sample, reduce)
        word_ins = student.outputs["word_ins"]
        logits, nat_target = word_ins["out"], word_ins["tgt"]
        # the iterative NAT stacks its refinement steps along the batch: the same references, repeated
        steps = logits.size(0) // sample["target"].size(0)
        if logits.shape[:2] != (steps * sample["target"].size(0), sample["target"].size(1)) or \
                not torch.equal(nat_target, sample["target"].repeat(steps, 1)):
            raise TeacherError("nat_word_kd: the student's word_ins output is not aligned with the reference")

        src, src_lengths, prev, at_target = at_inputs_from_nat_sample(sample, self.bos, self.eos, self.padding_idx)
        teacher_lprobs, teacher_index = self.teacher.distributions(
            sample["id"], src, src_lengths, prev, at_target, self.padding_idx, model.training, logits)
        if steps > 1:
            at_target, teacher_lprobs = at_target.repeat(steps, 1), teacher_lprobs.repeat(steps, 1, 1)
            teacher_index = None if teacher_index is None else teacher_index.repeat(steps, 1, 1)
        nat_mask = word_ins.get("mask")
        nat_mask = at_target.ne(self.padding_idx) if nat_mask is None else nat_mask[:, 1:] & at_target.ne(self.padding_idx)
        student_rows = logits[:, 1:][nat_mask]
        teacher_rows = teacher_lprobs[nat_mask]
        index_rows = None if teacher_index is None else teacher_index[nat_mask]
        if student_rows.numel():
            soft = self.temperature ** 2 * soft_kl(student_rows, teacher_rows, self.temperature, index_rows).mean()
            agree = (student_rows.argmax(-1) == teacher_top1(teacher_rows, index_rows)).sum().item()
        else:
            soft, agree = logits.new_zeros(()), 0
        loss = loss + (1.0 - self.alpha) * soft

        if self.alpha == 0:  # fairseq logs each loss divided by its factor; report the unweighted hard loss
            hard = self._compute_loss(logits, nat_target, word_ins.get("mask"), word_ins.get("ls", 0.0))
            logging_output["word_ins-loss"] = hard["loss"].item()
        logging_output["loss"] = loss.data
        logging_output["word_kd_soft-loss"] = soft.item()
        logging_output["kd_agree"] = agree
        logging_output["kd_tokens"] = int(nat_mask.sum())
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        LabelSmoothedDualImitationCriterion.reduce_metrics(logging_outputs)
        log_agreement(logging_outputs)
