"""Unit tests of the decoding strategies: hand-computed values, no model needed."""
import math

import pytest
import torch
from fairseq.data import Dictionary

from nat_kd.distill.decoding import STRATEGIES, DecodingSettings, build_strategy
from nat_kd.distill.decoding.sampling import (ReproducibleSampling, filter_top_k, filter_top_p, fmix32, inverse_cdf,
                                      uniform_draws)


def py_fmix32(x: int) -> int:
    """MurmurHash3 fmix32 in plain Python integers, written from the reference C."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_fmix32_matches_reference_and_known_value():
    values = [0, 1, 2, 12345, 0xFFFFFFFF, 0xDEADBEEF, 2**31]
    assert fmix32(torch.tensor(values)).tolist() == [py_fmix32(v) for v in values]
    assert py_fmix32(0) == 0
    assert py_fmix32(1) == 0x514E28B7  # MurmurHash3 fmix32(1), a published test value


def test_uniform_draws_are_a_function_of_seed_id_step_only():
    ids = torch.tensor([7, 3, 1000, 3])
    u = uniform_draws(5, ids, step=2)
    assert u.dtype == torch.float64 and ((u >= 0) & (u < 1)).all()
    assert u[1] == u[3]  # same sentence, same step
    assert torch.equal(uniform_draws(5, ids[[2, 0]], 2), u[[2, 0]])  # order / batch does not matter
    assert not torch.equal(uniform_draws(6, ids, 2), u)  # the seed matters
    assert not torch.equal(uniform_draws(5, ids, 3), u)  # the step matters
    many = uniform_draws(1, torch.arange(20000), 0)
    assert abs(many.mean().item() - 0.5) < 0.01 and len(set(many.tolist())) == 20000


def test_inverse_cdf_hand_values():
    probs = torch.tensor([[0.1, 0.2, 0.7], [0.1, 0.2, 0.7], [0.1, 0.2, 0.7], [0.0, 0.5, 0.0]])
    u = torch.tensor([0.05, 0.25, 0.31, 0.99])
    # cdf 0.1, 0.3, 1.0: 0.05 -> 0, 0.25 -> 1, 0.31 -> 2; the last row has mass at 1 only
    assert inverse_cdf(probs, u).tolist() == [0, 1, 2, 1]
    # unnormalised mass is scaled: [1, 1] with u=0.6 -> second token
    assert inverse_cdf(torch.tensor([[1.0, 1.0]]), torch.tensor([0.6])).tolist() == [1]


def test_top_k_and_top_p_filters_hand_values():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]], dtype=torch.float64)
    assert filter_top_k(probs, 2).tolist() == [[0.0, 0.4, 0.0, 0.3]]
    assert torch.equal(filter_top_k(probs, 10), probs)
    # sorted 0.4, 0.3, 0.2, 0.1; mass before: 0, 0.4, 0.7, 0.9 -> p=0.5 keeps 0.4 and 0.3; p=0.4 keeps 0.4 only
    assert filter_top_p(probs, 0.5).tolist() == [[0.0, 0.4, 0.0, 0.3]]
    assert filter_top_p(probs, 0.4).tolist() == [[0.0, 0.4, 0.0, 0.0]]
    assert filter_top_p(probs, 0.75).tolist() == [[0.0, 0.4, 0.2, 0.3]]


def _dictionary(size=6):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def test_sampling_search_step_independent_of_batch_and_respects_filters():
    d = _dictionary()
    torch.manual_seed(0)
    lprobs = torch.log_softmax(torch.randn(5, 1, len(d)), dim=-1)
    ids = torch.tensor([11, 4, 9, 2, 30])
    search = ReproducibleSampling(d, seed=3)
    scores, tokens, beams = search.step(0, lprobs.clone(), None, original_batch_idxs=ids)
    sub_scores, sub_tokens, _ = search.step(0, lprobs[[3, 1]].clone(), None, original_batch_idxs=ids[[3, 1]])
    assert sub_tokens.view(-1).tolist() == tokens.view(-1)[[3, 1]].tolist()
    assert beams.eq(0).all()
    # the score is the model's log-probability of the drawn token
    assert torch.allclose(scores.view(-1), lprobs.view(5, -1).gather(1, tokens).view(-1))
    # top-1 sampling is greedy
    _, top1, _ = ReproducibleSampling(d, seed=3, top_k=1).step(0, lprobs.clone(), None, original_batch_idxs=ids)
    assert top1.view(-1).tolist() == lprobs.view(5, -1).argmax(-1).tolist()
    # a -inf (e.g. pad) token is never drawn
    masked = lprobs.clone()
    masked[:, :, 4] = -math.inf
    for seed in range(20):
        _, t, _ = ReproducibleSampling(d, seed=seed).step(0, masked.clone(), None, original_batch_idxs=ids)
        assert not t.eq(4).any()


def test_sampling_draws_follow_the_distribution():
    d = _dictionary(2)  # 4 specials + 2 words
    probs = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.25, 0.75])
    lprobs = probs.log().expand(4000, 1, 6).clone()
    _, tokens, _ = ReproducibleSampling(d, seed=1).step(0, lprobs, None, original_batch_idxs=torch.arange(4000))
    share = tokens.eq(5).float().mean().item()
    assert 0.72 < share < 0.78


def test_seq_inter_picks_highest_sentence_bleu_and_keeps_order_on_ties():
    strategy = build_strategy(DecodingSettings(strategy="seq-inter", beam=3))
    reference = "a man is riding a red bike"
    candidates = ["a woman walks", "a man is riding a red bike", "a man is riding a bike"]
    assert strategy.choose(candidates, reference) == 1
    assert strategy.choose(["x y", "x y"], reference) == 0
    chrf = build_strategy(DecodingSettings(strategy="seq-inter", seq_inter_metric="chrf"))
    assert chrf.choose(["ridin bik", "zzz"], reference) == 0


def test_registry_and_settings_validation():
    assert set(STRATEGIES) == {"beam", "greedy", "sampling", "topk", "topp", "seq-inter"}
    assert build_strategy(DecodingSettings(strategy="greedy", beam=5)).beam_size == 1
    assert build_strategy(DecodingSettings(strategy="topk", beam=5)).beam_size == 1
    assert build_strategy(DecodingSettings(strategy="sampling", temperature=0.5)).temperature == 0.5
    assert build_strategy(DecodingSettings(strategy="beam", temperature=0.5)).temperature == 1.0
    with pytest.raises(ValueError, match="unknown strategy"):
        build_strategy(DecodingSettings(strategy="nope"))
    with pytest.raises(ValueError, match="temperature"):
        build_strategy(DecodingSettings(strategy="sampling", temperature=0))
    with pytest.raises(ValueError, match="k must be"):
        build_strategy(DecodingSettings(strategy="topk", top_k=0))
    with pytest.raises(ValueError, match="p must be"):
        build_strategy(DecodingSettings(strategy="topp", top_p=1.5))
    with pytest.raises(ValueError, match="metric"):
        build_strategy(DecodingSettings(strategy="seq-inter", seq_inter_metric="ter"))
