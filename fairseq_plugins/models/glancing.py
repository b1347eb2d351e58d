"""Glancing (Qian et al., ACL 2021), shared by GLAT, CTC with glancing and the DA-Transformer.

During training a first decoder pass without gradients measures how far the model is from the reference
(the Hamming distance); the worse it is, the more reference tokens are revealed ("glanced") to the second,
trained pass, whose loss covers only what it was not shown. The ratio of the distance revealed is annealed
over training.
"""
import torch

# GLAT's recipe anneals the ratio 0.5 -> 0.3 over its first 200k updates ("--glat-p 0.5:0.3@200k").
DEFAULT_ANNEAL_UPDATES = 200_000


def glance_ratio(num_updates: int, start: float = 0.5, end: float = 0.3,
                 anneal_updates: int = DEFAULT_ANNEAL_UPDATES) -> float:
    """The glancing ratio after ``num_updates``: linear from ``start`` to ``end``, then ``end`` for good."""
    if anneal_updates <= 0:
        return end
    progress = min(max(num_updates, 0) / anneal_updates, 1.0)
    return start + (end - start) * progress


def glance_count(hamming: torch.LongTensor, ratio: float) -> torch.LongTensor:
    """How many reference tokens to reveal per sentence: ``floor(hamming * ratio)``.

    Rounded down, as GLAT's reference code does (``.long()`` of the float product), so a sentence the first
    pass got right but for one token reveals nothing at ratio < 1.
    """
    return torch.floor(hamming.to(torch.float64) * ratio).long()


def glancing_mask(candidates: torch.BoolTensor, num_glance: torch.LongTensor,
                  generator: torch.Generator = None) -> torch.BoolTensor:
    """Reveal exactly ``min(num_glance[b], candidates[b].sum())`` positions of row b, uniformly among its candidates.

    Every candidate gets a uniform random score and non-candidates a score above all of them; a position is
    revealed when its rank within its row is below the row's count. One sort for the whole batch, so the
    chosen set is a uniform random subset of the candidates of the requested size.
    """
    if candidates.dim() != 2 or num_glance.shape != candidates.shape[:1]:
        raise ValueError(f"glancing_mask: candidates must be [B, T] and num_glance [B], got "
                         f"{tuple(candidates.shape)} and {tuple(num_glance.shape)}")
    scores = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    scores = scores.masked_fill(~candidates, 2.0)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    return candidates & (ranks < num_glance.to(candidates.device).unsqueeze(1))
