"""``multi_reference_nat_loss``: fairseq's nat_loss over several references per sentence.

On a batch with ``references`` (kd_translation_lev --references K) the model's ``forward_references`` gives
the loss: each sentence trained on the reference it fits best (``--reference-selection min``, DDRS: Shao et
al., NAACL 2022), or on all of them averaged (``mean``). A batch without them (validation) is nat_loss's.
Only families whose loss is computed per sentence from a whole reference take it (CTC, with or without
glancing, and the DA-Transformer); the rest refuse it at their first batch.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.criterions.nat_loss import LabelSmoothedDualImitationCriterion, LabelSmoothedDualImitationCriterionConfig


@dataclass
class MultiReferenceNatLossConfig(LabelSmoothedDualImitationCriterionConfig):
    reference_selection: str = field(default="min", metadata={
        "help": "min: each sentence on the reference its first pass fits best (DDRS); mean: on every reference"})


class _References:
    """The model as nat_loss calls it, answering with its loss over the batch's references."""

    def __init__(self, model, references, selection: str):
        self.model, self.references, self.selection = model, references, selection

    def __call__(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens):
        return self.model.forward_references(src_tokens, src_lengths, self.references, self.selection)


@register_criterion("multi_reference_nat_loss", dataclass=MultiReferenceNatLossConfig)
class MultiReferenceNatLoss(LabelSmoothedDualImitationCriterion):
    def __init__(self, task, label_smoothing, reference_selection):
        super().__init__(task, label_smoothing)
        if reference_selection not in ("min", "mean"):
            raise ValueError(f"--reference-selection {reference_selection}: choose min or mean")
        self.reference_selection = reference_selection

    def forward(self, model, sample, reduce=True):
        if "references" not in sample:
            return super().forward(model, sample, reduce)
        if not hasattr(model, "forward_references"):
            raise TypeError(f"--criterion multi_reference_nat_loss: {type(model).__name__} takes one reference a "
                            "sentence; train a CTC student (kd_ctc_*, kd_glat_ctc_*) or a DA-Transformer (kd_dat_*) on several")
        return super().forward(_References(model, sample["references"], self.reference_selection), sample, reduce)
