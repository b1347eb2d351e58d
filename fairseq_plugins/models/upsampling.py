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


def collapse_repeats(tokens: torch.LongTensor, scores: torch.Tensor, pad: int, blank: int | None = None):
    """Merge each run of one token into that token, then drop ``blank`` (CTC's; the DA-Transformer has none)
    and padding: returns (tokens, scores, lengths), left-aligned, padded with ``pad``; a kept token has the
    score of the first position of its run. Runs are merged before blanks are dropped, so a blank between
    two equal tokens keeps both."""
    keep = tokens.ne(pad) if blank is None else tokens.ne(pad) & tokens.ne(blank)
    keep[:, 1:] &= tokens[:, 1:].ne(tokens[:, :-1])
    lengths = keep.sum(1)
    width = int(lengths.max()) if tokens.size(0) else 0
    slot = torch.where(keep, keep.cumsum(1) - 1, width)  # dropped positions go to a spare column
    out = tokens.new_full((tokens.size(0), width + 1), pad).scatter_(1, slot, tokens)
    out_scores = scores.new_zeros((scores.size(0), width + 1)).scatter_(1, slot, scores)
    return out[:, :width], out_scores[:, :width], lengths


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
