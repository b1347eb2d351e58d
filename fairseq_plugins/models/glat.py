"""GLAT, the glancing transformer (Qian et al., ACL 2021), on fairseq's vanilla NAT.

Training: the decoder reads the source embeddings copied uniformly to the reference length; a first pass
without gradients predicts every position, and ``glance_count`` of its Hamming distance to the reference
positions are revealed at random (their reference embeddings replace the copied ones) to a second pass,
trained on the positions it was not shown. The length loss is vanilla NAT's. Decoding is vanilla NAT's
single pass from the predicted length (``--iter-decode-max-iter 0``).
"""
import torch
from fairseq.models import register_model
from fairseq.models.nat.nonautoregressive_transformer import NATransformerModel
from fairseq.models.nat.nonautoregressive_transformer import base_architecture as nat_base_architecture

from .glancing import (Glancing, GlancingDecoder, add_glancing_args, build_nat_decoder,
                       glance_count, glancing_defaults, glancing_mask, predicted_tokens)


@register_model("glat")
class GLATModel(Glancing, NATransformerModel):
    @staticmethod
    def add_args(parser):
        NATransformerModel.add_args(parser)
        add_glancing_args(parser)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return build_nat_decoder(GlancingDecoder, args, tgt_dict, embed_tokens)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, **kwargs)
        length_out = self.decoder.forward_length(normalize=False, encoder_out=encoder_out)
        length_tgt = self.decoder.forward_length_prediction(length_out, encoder_out, tgt_tokens)

        glanced = self.glance(prev_output_tokens, tgt_tokens, encoder_out)
        inputs = torch.where(glanced, tgt_tokens, prev_output_tokens)
        word_ins_out = self.decoder(normalize=False, prev_output_tokens=inputs, encoder_out=encoder_out)
        return {
            "word_ins": {
                "out": word_ins_out,
                "tgt": tgt_tokens,
                "mask": tgt_tokens.ne(self.pad) & ~glanced,
                "ls": self.args.label_smoothing,
                "nll_loss": True,
            },
            "length": {"out": length_out, "tgt": length_tgt, "factor": self.decoder.length_loss_factor},
        }

    def glance(self, prev_output_tokens, tgt_tokens, encoder_out) -> torch.BoolTensor:
        """The reference positions revealed to the trained pass ([B, T], none outside training)."""
        # <s> and </s> are in the decoder's input already: neither counted in the Hamming distance nor revealed.
        # GLAT's reference code counts them and may reveal them, spending a glance on a token the decoder sees.
        candidates = prev_output_tokens.eq(self.unk) & tgt_tokens.ne(self.pad)
        ratio = self.current_glance_ratio()
        if ratio <= 0:
            return torch.zeros_like(candidates)
        with torch.no_grad():
            predicted = predicted_tokens(self.decoder(normalize=False, prev_output_tokens=prev_output_tokens,
                                                      encoder_out=encoder_out))
        hamming = (predicted.ne(tgt_tokens) & candidates).sum(1)
        revealed = glancing_mask(candidates, glance_count(hamming, ratio))
        self.log_glancing(ratio, revealed, candidates)
        return revealed


def glat_base_architecture(args):
    glancing_defaults(args, start=0.5, end=0.3)
    nat_base_architecture(args)
