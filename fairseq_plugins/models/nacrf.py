"""NAT-CRF (Sun et al., NeurIPS 2019) on fairseq's ``nacrf_transformer``, runnable with numpy >= 1.24.

fairseq's ``DynamicCRF._compute_normalizer`` (fairseq/modules/dynamic_crf_layer.py) forces the reference
tokens into the beam with ``np.float("inf")``; numpy 1.24 removed the ``np.float`` alias, so every training
step fails with AttributeError. The subclass below selects the same beam itself and hands fairseq's method
emissions on which that beam is the top-k (everything outside it at -inf), so fairseq's own code computes
the normalizer; parameter names are unchanged, so checkpoints load in either model.
"""
import torch
from fairseq.models import register_model
from fairseq.models.nat.nat_crf_transformer import NACRFTransformerModel
from fairseq.modules import DynamicCRF


class BeamForcedCRF(DynamicCRF):
    def _compute_normalizer(self, emissions, targets=None, masks=None, beam=None):
        if targets is not None:
            # fairseq's beam: at each position the reference token, then the highest scoring others
            beam = beam if beam is not None else self.beam
            forced = emissions.scatter(2, targets.unsqueeze(-1), float("inf"))
            in_beam = torch.zeros_like(emissions, dtype=torch.bool).scatter_(2, forced.topk(beam, 2)[1], True)
            emissions = emissions.masked_fill(~in_beam, float("-inf"))
        return super()._compute_normalizer(emissions, None, masks, beam)


@register_model("nacrf")
class NACRFModel(NACRFTransformerModel):
    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.crf_layer = BeamForcedCRF(num_embedding=len(self.tgt_dict), low_rank=args.crf_lowrank_approx,
                                       beam_size=args.crf_beam_approx)

