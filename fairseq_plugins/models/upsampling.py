"""What the students whose output length is a multiple of the source length share (CTC NAT, the
DA-Transformer): they predict no length, so the upsampled source length is the number of decoder positions,
and their losses sum over every alignment of the reference."""
import torch
from fairseq.iterative_refinement_generator import DecoderOut

from .glancing import build_nat_decoder


def upsampled_inputs(src_tokens: torch.LongTensor, upsample_factor: int, unk: int, pad: int) -> torch.LongTensor:
    """Decoder input tokens, [B, factor x the longest source]: ``<unk>`` (to predict) at ``upsample_factor`` x
    the source's real tokens (</s> included) positions, padding after them, whichever side the source is
    padded on."""
    lengths = src_tokens.ne(pad).sum(1) * upsample_factor
    positions = torch.arange(int(lengths.max()), device=src_tokens.device)
    tokens = torch.full((src_tokens.size(0), positions.size(0)), pad, dtype=torch.long, device=src_tokens.device)
    return tokens.masked_fill(positions[None, :] < lengths[:, None], unk)


def refuse_label_smoothing(args, model: str) -> None:
    """Fail at build time on ``--label-smoothing`` > 0: the CTC and DAG losses sum over every alignment of the
    reference, so no position has one target to smooth, and nat_loss would drop the value without a word (the
    DA-Transformer's reference code refuses it too)."""
    if getattr(args, "label_smoothing", 0) > 0:
        raise ValueError(f"{model}: its loss has no label smoothing, but --label-smoothing is "
                         f"{args.label_smoothing}; train it with --label-smoothing 0")


class UpsampledStudent:
    """Mixin of a fairseq NAT model on upsampled source positions: builds its ``decoder_class``, refuses
    label smoothing, and starts decoding from ``<unk>`` at every position."""

    decoder_class: type
    model_name: str  # for messages

    @classmethod
    def build_model(cls, args, task):
        refuse_label_smoothing(args, cls.model_name)
        return super().build_model(args, task)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return build_nat_decoder(cls.decoder_class, args, tgt_dict, embed_tokens)

    def initialize_output_tokens(self, encoder_out, src_tokens):
        tokens = upsampled_inputs(src_tokens, self.args.upsample_factor, self.unk, self.pad)
        return DecoderOut(output_tokens=tokens, output_scores=torch.zeros_like(tokens, dtype=torch.float),
                          attn=None, step=0, max_step=0, history=None)
