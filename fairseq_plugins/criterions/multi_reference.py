"""``multi_reference_nat_loss``: fairseq's nat_loss over several references per sentence.

On a batch with ``references`` (kd_translation_lev --references K) the loss takes them all; a batch without
them (validation) is nat_loss's. ``--reference-selection``:

- ``ddrs`` (Shao et al., NAACL 2022), as ictnlp/DDRS-NAT's ``DDRSCriterion.curr_loss`` computes it (what
  differs and why: docs/authors_code.md): each sentence's CTC loss summed over its tokens against each of its
  references, combined over the batch by ``ddrs_loss`` at ``ddrs_progress``. A CTC student only (its
  ``reference_nll``).
- ``per-token-min``: each sentence trained on the reference its first pass gives the lowest loss per token,
  glancing at that one; ``per-token-mean``: on every reference, the per-token losses averaged. Not DDRS's:
  the model's ``forward_references`` (CTC, with or without glancing, and the DA-Transformer).

The other families take one reference a sentence and refuse several at their first batch.
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.nat_loss import LabelSmoothedDualImitationCriterion, LabelSmoothedDualImitationCriterionConfig

SELECTIONS = ("ddrs", "per-token-min", "per-token-mean")
LSE_UNTIL = 2 / 3  # DDRS-NAT's curr_lambda: where the schedule passes from (mean -> log-sum-exp) to (-> min)


def ddrs_progress(update: int, max_update: int, save_interval_updates: int) -> float:
    """DDRS-NAT's t: ``update / (max_update - 4 x save_interval_updates)``, so that the last four saves of its
    recipe (the checkpoints it averages) are trained on the minimum alone."""
    return update / (max_update - 4 * save_interval_updates)


def ddrs_loss(nll, lengths, fits, t: float):
    """DDRS's loss of a batch: ``nll`` [B, K] each sentence's CTC loss summed over its tokens against each
    reference, ``lengths`` [B, K] the references' lengths, ``fits`` [B, K] where an alignment fits (the others
    add to no sum; a sentence none fits adds nothing). Three batch losses:

    - mean: every loss summed over the sum of every reference's length;
    - log-sum-exp: -sum over sentences of logsumexp(-losses), over the summed mean reference length;
    - min: the sum of each sentence's lowest loss over the sum of those references' lengths;

    at ``t``: (1 - a) mean + a lse with a = t / (2/3) while t < 2/3, then (1 - a) lse + a min with
    a = (t - 2/3) / (1/3) while t < 1, then the min alone."""
    kept = fits.any(1)
    if not kept.any():
        return nll.sum() * 0.0
    nll, lengths, fits = nll[kept], lengths[kept].to(nll.dtype), fits[kept]
    chosen = nll.detach().masked_fill(~fits, float("inf")).argmin(1, keepdim=True)
    minimum = nll.gather(1, chosen).sum() / lengths.gather(1, chosen).sum()
    if t >= 1:
        return minimum
    mean_length = (lengths * fits).sum(1) / fits.sum(1)
    lse = -torch.logsumexp((-nll).masked_fill(~fits, float("-inf")), 1).sum() / mean_length.sum()
    if t >= LSE_UNTIL:
        a = (t - LSE_UNTIL) / (1 - LSE_UNTIL)
        return a * minimum + (1 - a) * lse
    mean = nll[fits].sum() / lengths[fits].sum()
    a = t / LSE_UNTIL
    return a * lse + (1 - a) * mean


@dataclass
class MultiReferenceNatLossConfig(LabelSmoothedDualImitationCriterionConfig):
    reference_selection: str = field(default="ddrs", metadata={
        "help": "ddrs: DDRS's annealed loss (CTC students); per-token-min: each sentence on the reference its "
                "first pass fits best per token; per-token-mean: on every reference"})
    # DDRS-NAT's recipe trains 300000 updates saving every 5000; its criterion reads the save interval from an
    # attribute it never sets, so both are given here
    ddrs_max_update: int = field(default=300000, metadata={
        "help": "DDRS's schedule: t = update / (this - 4 x --ddrs-save-interval-updates) (DDRS-NAT's recipe: its "
                "--max-update, 300000)"})
    ddrs_save_interval_updates: int = field(default=5000, metadata={
        "help": "DDRS's schedule: see --ddrs-max-update (DDRS-NAT's recipe: its --save-interval-updates, 5000)"})


class _References:
    """The model as nat_loss calls it, answering with its loss over the batch's references."""

    def __init__(self, model, references, criterion):
        self.model, self.references, self.criterion = model, references, criterion

    def __call__(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens):
        selection, model = self.criterion.reference_selection, self.model
        if selection != "ddrs":
            return model.forward_references(src_tokens, src_lengths, self.references,
                                            selection.removeprefix("per-token-"))
        if not hasattr(model, "reference_nll"):
            raise TypeError(f"--reference-selection ddrs: {type(model).__name__} has no per-sentence CTC loss; "
                            "train a CTC student (kd_ctc_*, kd_glat_ctc_*), or give per-token-min or per-token-mean")
        # the update kd_translation_lev hands the model before each step
        t = ddrs_progress(model.num_updates, self.criterion.ddrs_max_update, self.criterion.ddrs_save_interval_updates)
        return {"ctc": {"loss": ddrs_loss(*model.reference_nll(src_tokens, src_lengths, self.references), t),
                        "factor": 1.0}}


@register_criterion("multi_reference_nat_loss", dataclass=MultiReferenceNatLossConfig)
class MultiReferenceNatLoss(LabelSmoothedDualImitationCriterion):
    def __init__(self, task, label_smoothing, reference_selection, ddrs_max_update, ddrs_save_interval_updates):
        super().__init__(task, label_smoothing)
        if reference_selection not in SELECTIONS:
            raise ValueError(f"--reference-selection {reference_selection}: choose {', '.join(SELECTIONS)}")
        if ddrs_max_update - 4 * ddrs_save_interval_updates <= 0:
            raise ValueError(f"--ddrs-max-update {ddrs_max_update} must exceed 4 x --ddrs-save-interval-updates "
                             f"({4 * ddrs_save_interval_updates}): DDRS's schedule divides by their difference")
        self.reference_selection = reference_selection
        self.ddrs_max_update, self.ddrs_save_interval_updates = ddrs_max_update, ddrs_save_interval_updates

    def forward(self, model, sample, reduce=True):
        if "references" not in sample:
            return super().forward(model, sample, reduce)
        if not hasattr(model, "forward_references"):
            raise TypeError(f"--criterion multi_reference_nat_loss: {type(model).__name__} takes one reference a "
                            "sentence; train a CTC student (kd_ctc_*, kd_glat_ctc_*) or a DA-Transformer (kd_dat_*) on several")
        return super().forward(_References(model, sample["references"], self), sample, reduce)
