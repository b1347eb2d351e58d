"""Ancestral sampling (plain, top-k, nucleus) whose draws depend only on (seed, sentence, step).

fairseq's own ``Sampling`` search draws from torch's global generator, so a sentence's sample changes with
the batch it lands in, the shard, or a resumed run. Here every (sentence id, step) gets one uniform number
from a counter-based hash of (seed, sentence id, step), and the token is picked by inverse CDF over the
filtered distribution: the same sentence gets the same sample whatever the batching. All of it is
vectorised over the batch (no Python loop per sentence or token).

Temperature is applied by fairseq's SequenceGenerator to the logits before this search sees them.
"""
from __future__ import annotations

import torch
from fairseq.search import Search

MASK32 = 0xFFFFFFFF


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2**32).

    Products of two 32-bit values can overflow int64's sign bit; the low 32 bits, all we keep, are exact.
    """
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def uniform_draws(seed: int, sentence_ids: torch.Tensor, step: int) -> torch.Tensor:
    """One float64 in [0, 1) per sentence id, a pure function of (seed, id, step), with 53 random bits."""
    ids = sentence_ids.to(torch.int64)
    key = fmix32(fmix32(ids ^ fmix32(torch.full_like(ids, seed & MASK32))) ^ (step & MASK32))
    high = fmix32(key ^ 0x68E31DA4) >> 5  # 27 bits
    low = fmix32(key ^ 0xB5297A4D) >> 6  # 26 bits
    return (high * 67108864 + low).to(torch.float64) / 9007199254740992.0  # (high * 2**26 + low) / 2**53


def filter_top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Zero every probability outside each row's k largest (ties at the k-th broken by topk's order)."""
    if k <= 0 or k >= probs.size(-1):
        return probs
    _, keep = probs.topk(k, dim=-1)
    return torch.zeros_like(probs).scatter_(-1, keep, probs.gather(-1, keep))


def filter_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    """Keep each row's smallest set of most probable tokens whose mass reaches p (Holtzman et al., 2019)."""
    if p <= 0 or p >= 1:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # exclusive cumulative sum: the mass of the more probable tokens before each one
    mass_before = torch.cat([torch.zeros_like(sorted_probs[..., :1]), sorted_probs[..., :-1]], dim=-1).cumsum(dim=-1)
    keep_sorted = mass_before < p  # the most probable token is always kept (mass before it is 0)
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return probs.masked_fill(~keep, 0.0)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative (unnormalised) mass exceeds u * total mass."""
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    targets = (uniforms.to(torch.float64) * cdf[:, -1]).unsqueeze(-1)
    picks = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    # u * total < total always, but guard against landing on trailing zero-mass tokens by rounding
    return picks.clamp_(max=probs.size(-1) - 1)


class ReproducibleSampling(Search):
    """A single ancestral sample per sentence (beam size 1), optionally top-k or nucleus filtered."""

    def __init__(self, tgt_dict, seed: int, top_k: int = -1, top_p: float = -1.0):
        super().__init__(tgt_dict)
        self.seed, self.top_k, self.top_p = seed, top_k, top_p

    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
        bsz, beam_size, vocab_size = lprobs.size()
        if beam_size != 1:
            raise ValueError("ReproducibleSampling draws one sample per sentence: use beam size 1")
        if original_batch_idxs is None:
            raise ValueError("ReproducibleSampling needs the sentence ids (sample['id']) to seed each sentence")
        logp = lprobs.view(bsz, vocab_size)
        probs = logp.exp()  # -inf (pad, forced EOS, ...) becomes exactly 0: never drawn
        probs = filter_top_k(probs, self.top_k)
        probs = filter_top_p(probs, self.top_p)
        tokens = inverse_cdf(probs, uniform_draws(self.seed, original_batch_idxs, step))
        token_scores = logp.gather(1, tokens.unsqueeze(1))  # the model's log-prob of the drawn token
        if step > 0:
            token_scores = token_scores + scores[:, :, step - 1]
        return token_scores.view(bsz, 1), tokens.view(bsz, 1), torch.zeros_like(tokens).view(bsz, 1)

