"""The glancing helper: the annealed ratio, GLAT's and the DA-Transformer's roundings, and the random reveal of
exact counts."""
import collections
import itertools

import pytest
import torch

from fairseq_plugins.models.glancing import glance_count, glance_ratio, glancing_mask, predicted_tokens


def test_ratio_anneals_linearly_then_stays():
    assert glance_ratio(0, 0.5, 0.3, 1000) == pytest.approx(0.5)
    assert glance_ratio(250, 0.5, 0.3, 1000) == pytest.approx(0.45)
    assert glance_ratio(1000, 0.5, 0.3, 1000) == pytest.approx(0.3)
    assert glance_ratio(5000, 0.5, 0.3, 1000) == pytest.approx(0.3)
    assert glance_ratio(10, 0.5, 0.3, 0) == pytest.approx(0.3)


def test_count_rounds_down_like_glat():
    hamming = torch.tensor([0, 1, 3, 7, 10])
    # 0*.5, 1*.5=0.5, 3*.5=1.5, 7*.5=3.5, 10*.5=5 -> floors by hand
    assert glance_count(hamming, 0.5).tolist() == [0, 0, 1, 3, 5]
    assert glance_count(hamming, 0.3).tolist() == [0, 0, 0, 2, 3]
    assert glance_count(hamming, 0.3).dtype == torch.long


def test_count_rounds_half_up_like_the_da_transformer():
    # number-random: int(h x r + 0.5); at the final ratio 0.1: 0.4, 0.5, 0.6, 1.4, 1.6 -> +0.5, floored
    hamming = torch.tensor([0, 4, 5, 6, 14, 16])
    assert glance_count(hamming, 0.1, round_half_up=True).tolist() == [0, 0, 1, 1, 1, 2]
    assert glance_count(hamming, 0.1).tolist() == [0, 0, 0, 0, 1, 1]


def test_predicted_tokens_are_argmax_over_the_vocabulary_first_on_a_tie():
    scores = torch.tensor([[[0.0, 3.0, 3.0, -1.0], [2.0, 2.0, 0.0, 2.0]],
                           [[-5.0, -4.0, -6.0, -4.5], [1.0, 0.0, 0.0, 7.0]]])
    assert predicted_tokens(scores).tolist() == [[1, 0], [1, 3]]
    noisy = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(predicted_tokens(noisy), noisy.argmax(-1))


def test_mask_reveals_exact_counts_among_candidates_only():
    g = torch.Generator().manual_seed(0)
    candidates = torch.rand(64, 13, generator=g) < 0.6
    num = torch.randint(0, 15, (64,), generator=g)
    mask = glancing_mask(candidates, num, generator=g)
    assert not (mask & ~candidates).any()
    expected = torch.minimum(num, candidates.sum(1))
    assert mask.sum(1).tolist() == expected.tolist()


def test_mask_is_deterministic_under_a_seed_and_varies_without():
    candidates = torch.ones(4, 20, dtype=torch.bool)
    num = torch.full((4,), 7)
    first = glancing_mask(candidates, num, torch.Generator().manual_seed(3))
    again = glancing_mask(candidates, num, torch.Generator().manual_seed(3))
    other = glancing_mask(candidates, num, torch.Generator().manual_seed(4))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_mask_picks_every_subset_about_equally_often():
    # 2 of the 4 candidates in a row of 6: 6 subsets, each expected 1/6 of the draws
    candidates = torch.tensor([[True, False, True, True, False, True]]).repeat(6000, 1)
    mask = glancing_mask(candidates, torch.full((6000,), 2), torch.Generator().manual_seed(1))
    subsets = collections.Counter(tuple(i for i, v in enumerate(row) if v) for row in mask.tolist())
    assert set(subsets) == set(itertools.combinations([0, 2, 3, 5], 2))  # every pair drawn, nothing else
    for count in subsets.values():
        assert abs(count - 1000) < 150  # about 5 standard deviations of a binomial(6000, 1/6)


def test_mask_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="num_glance"):
        glancing_mask(torch.ones(2, 3, dtype=torch.bool), torch.ones(3, dtype=torch.long))


@pytest.mark.parametrize("arch, schedule", [
    ("kd_glat_tiny", (0.5, 0.3, 300_000)),  # FLC777/GLAT: start_p 0.5, minus_p 0.2, total_up 300k
    ("kd_glat_ctc_tiny", (0.5, 0.3, 300_000)),  # its glat_ctc, the same task and schedule
    ("kd_dat_tiny", (0.5, 0.1, 200_000)),  # thu-coai/DA-Transformer's README: --glat-p 0.5:0.1@200k
])
def test_default_schedules_are_the_reference_recipes(arch, schedule):
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    import fairseq_plugins.models.nat  # noqa: F401  (registers the architectures)

    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.glance_start, args.glance_end, args.glance_anneal_updates) == schedule
