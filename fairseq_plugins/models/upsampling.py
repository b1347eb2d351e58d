"""The decoder inputs of the students whose output length is a multiple of the source length (CTC NAT, the
DA-Transformer): they predict no length, so the upsampled source length is the number of decoder positions."""
import torch


def upsampled_inputs(src_tokens: torch.LongTensor, upsample_factor: int, unk: int, pad: int) -> torch.LongTensor:
    """Decoder input tokens, [B, factor x the longest source]: ``<unk>`` (to predict) at ``upsample_factor`` x
    the source's real tokens (</s> included) positions, padding after them, whichever side the source is
    padded on."""
    lengths = src_tokens.ne(pad).sum(1) * upsample_factor
    positions = torch.arange(int(lengths.max()), device=src_tokens.device)
    tokens = torch.full((src_tokens.size(0), positions.size(0)), pad, dtype=torch.long, device=src_tokens.device)
    return tokens.masked_fill(positions[None, :] < lengths[:, None], unk)
