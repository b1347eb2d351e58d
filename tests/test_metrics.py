"""Metrics against hand-computed values on tiny tables, alignments and unigram models."""
import math

import numpy as np
import pytest

from nat_kd.analysis.formats import NULL_WORD, Alignments, TranslationTable
from nat_kd.analysis.metrics import Complexity, Faithfulness, Modes, Reordering, UnigramModels, align_corpus
from nat_kd.analysis.metrics.base import Signature
from nat_kd.analysis.tokenizers import get_tokenizer


def table(entries):
    """TranslationTable from {(x, y): p}."""
    rows = list(dict.fromkeys(x for x, _ in entries))
    cols = list(dict.fromkeys(y for _, y in entries))
    return TranslationTable(rows, cols, np.array([rows.index(x) for x, _ in entries]),
                            np.array([cols.index(y) for _, y in entries]), np.array(list(entries.values()), float))


# ---------------------------------------------------------------- complexity

def test_entropy_of_a_known_table():
    # a: two equally likely translations (ln 2); b: one (0); c: unnormalised 0.2/0.2 renormalises to ln 2;
    # the NULL row is left out
    t = table({(NULL_WORD, "x"): 0.1, (NULL_WORD, "y"): 0.9, ("a", "x"): 0.5, ("a", "y"): 0.5, ("b", "x"): 1.0,
               ("c", "x"): 0.2, ("c", "y"): 0.2})
    score = Complexity().table_score(t)
    assert score.vocab_size == 3
    assert score.score == pytest.approx(2 * math.log(2) / 3)
    assert Complexity("2").table_score(t).score == pytest.approx(2 / 3)
    assert score.most_uncertain(1)[0][1] == pytest.approx(math.log(2))
    assert score.least_uncertain(1) == [("b", 0.0)]


def test_entropy_is_between_zero_and_log_vocab():
    rng = np.random.default_rng(0)
    entries = {(f"s{i}", f"t{j}"): float(rng.random()) for i in range(20) for j in range(rng.integers(1, 9))}
    score = Complexity().table_score(table(entries))
    widths = {x: sum(1 for (a, _) in entries if a == x) for x, _ in entries}
    for word, h in zip(score.words, score.entropies):
        assert -1e-12 <= h <= math.log(widths[word]) + 1e-12


# ---------------------------------------------------------------- faithfulness

def test_kl_of_known_tables():
    real = table({("a", "x"): 0.5, ("a", "y"): 0.5})
    distilled = table({("a", "x"): 0.75, ("a", "y"): 0.25})
    assert Faithfulness().table_score(real, distilled).score == pytest.approx(0.5 * math.log(4 / 3))
    assert Faithfulness().table_score(real, real).score == pytest.approx(0.0, abs=1e-15)


def test_floor_for_missing_translation_and_missing_word():
    floor = 1e-6
    real = table({("a", "x"): 1.0, ("b", "x"): 0.5, ("b", "y"): 0.5})
    distilled = table({("a", "y"): 1.0})
    score = Faithfulness(floor=floor).table_score(real, distilled)
    # a: q(x|a) = floor, rescaled by 1 + floor; b: absent, q = floor everywhere: ln(1/floor) - ln 2
    kl_a = math.log((1 + floor) / floor)
    kl_b = math.log(1 / floor) - math.log(2)
    assert score.missing_words == 1
    assert score.score == pytest.approx((kl_a + kl_b) / 2)
    assert dict(zip(score.words, score.divergences)) == pytest.approx({"a": kl_a, "b": kl_b})


def test_kl_is_never_negative():
    rng = np.random.default_rng(1)
    for _ in range(20):
        real = table({(f"s{i}", f"t{j}"): float(rng.random()) for i in range(5) for j in range(6) if rng.random() < 0.6})
        dist = table({(f"s{i}", f"t{j}"): float(rng.random()) for i in range(5) for j in range(6) if rng.random() < 0.6})
        assert (Faithfulness().table_score(real, dist).divergences >= 0).all()


# ---------------------------------------------------------------- reordering

def frs(*lines, convention="chunks"):
    sent, src, tgt = [], [], []
    for k, line in enumerate(lines):
        for link in line.split():
            i, j = map(int, link.split("-"))
            sent.append(k), src.append(i), tgt.append(j)
    return Reordering(convention).corpus_score(Alignments(np.array(sent, dtype=np.int64), np.array(src, dtype=np.int64),
                                                          np.array(tgt, dtype=np.int64), len(lines)))


@pytest.mark.parametrize("line,expected", [
    ("0-0 1-1 2-2 3-3", 1.0),       # monotone: one chunk
    ("0-1 1-0 2-2 3-3", 1 / 3),     # the docs' example: chunks [b] [a] [c d], 1 - 2/3
    ("0-2 1-1 2-0", 0.0),           # fully inverted: every word its own chunk
    ("0-0 2-1", 1.0),               # source word 1 unaligned: dropped, the rest is monotone
    ("0-0 1-0 2-1", 1.0),           # many-to-one: ties keep source order
    ("0-1 0-2 1-0", 0.0),           # one-to-many: word 0 sits at its leftmost target 1, after word 1
    ("0-2 1-3 2-0 3-1", 2 / 3),     # two swapped blocks: chunks [c d] [a b], 1 - 1/3
])
def test_fuzzy_reordering_of_hand_aligned_sentences(line, expected):
    score = frs(line)
    assert score.sentences[0] == pytest.approx(expected)


def test_corpus_frs_is_the_mean_and_skips_short_sentences():
    score = frs("0-0 1-1", "0-1 1-0", "0-0", "")
    assert score.skipped == 2
    assert score.score == pytest.approx(0.5)
    assert np.isnan(score.sentences[2:]).all()


@pytest.mark.parametrize("line,expected", [
    # start marker, words in source order by the rank of their target span, end marker; a neighbour pair is
    # continuous where the rank stays or rises by one; FRS = continuous pairs / (M + 1)
    ("0-0 1-1 2-2 3-3", 5 / 5),     # ranks 0 1 2 3, end 4: all five pairs continuous
    ("0-1 1-0 2-2 3-3", 2 / 5),     # ranks 1 0 2 3: start->1 and 1->0 and 0->2 break
    ("0-2 1-1 2-0", 0 / 4),         # ranks 2 1 0, end 3: every pair breaks
    ("0-0 2-1", 3 / 3),             # word 1 unaligned: dropped, ranks 0 1
    ("0-0 1-0 2-1", 4 / 4),         # a and b share the span {0}: rank 0 twice, a tie is continuous
    ("0-0 1-1 2-0", 2 / 4),         # ranks 0 1 0, end 2: 1->0 and 0->end break (chunks: 0)
    ("0-1 0-2 1-0", 0 / 3),         # spans [1,2] and [0,0]: ranks 1 0, end 2
    ("0-2 1-3 2-0 3-1", 2 / 5),     # ranks 2 3 0 1, end 4: 2->3 and 0->1 continue (chunks: 2/3)
    ("0-0 0-1 1-0 1-1", 3 / 3),     # both words span [0,1]: one rank
    ("0-0", 1.0),                   # M < 2 scores 1
    ("", 1.0),
])
def test_boundary_convention_of_hand_aligned_sentences(line, expected):
    assert frs(line, convention="boundary").sentences[0] == pytest.approx(expected)


def test_boundary_convention_skips_nested_spans_and_averages_the_rest():
    # sentence 0: word 0 spans [0,2], word 1 sits at 1 inside it: no order, skipped; [0,1] and [1,2] overlap
    # without nesting: ranks 0 1, end 2, FRS 1
    score = frs("0-0 0-2 1-1", "0-0 0-1 1-1 1-2", "0-1 1-0", convention="boundary")
    assert np.isnan(score.sentences[0]) and score.skipped == 1
    assert score.sentences[1:] == pytest.approx([1.0, 0.0])
    assert score.score == pytest.approx(0.5)
    assert "1 with nested target spans skipped" in score.format()
    with pytest.raises(ValueError, match="unknown FRS convention 'talbot'; choose one of chunks, boundary"):
        Reordering("talbot")


# ---------------------------------------------------------------- modes

def test_mode_posteriors_of_a_constructed_example():
    # L1 = {a: .5, b: .5}, L2 = {b: .5, c: .5}, uniform prior.
    models = UnigramModels.from_texts({"L1": ["a b"], "L2": ["b c"]})
    score = Modes(models).corpus_score(["a b", "c c", "zzz", "a zzz"])
    # "a b": (p(L1|a) + p(L1|b)) / 2 = (1 + .5) / 2; "c c": 0; "zzz": unknown; "a zzz": only a counts
    assert score.posteriors[0] == pytest.approx([0.75, 0.25])
    assert score.posteriors[1] == pytest.approx([0.0, 1.0])
    assert np.isnan(score.posteriors[2]).all() and score.unknown == 1
    assert score.posteriors[3] == pytest.approx([1.0, 0.0])
    assert score.purity[[0, 1, 3]] == pytest.approx([0.75, 1.0, 1.0])
    assert score.mix == pytest.approx({"L1": (0.75 + 0 + 1) / 3, "L2": (0.25 + 1 + 0) / 3})
    assert score.argmax_share == pytest.approx({"L1": 2 / 3, "L2": 1 / 3})


def test_mode_prior_shifts_the_posterior():
    models = UnigramModels.from_texts({"L1": ["b"], "L2": ["b"]}, prior={"L1": 3, "L2": 1})
    assert Modes(models).corpus_score(["b"]).posteriors[0] == pytest.approx([0.75, 0.25])


# ---------------------------------------------------------------- signatures

def test_scores_carry_comparable_signatures():
    tok = get_tokenizer("13a", lowercase=True)
    aligned = align_corpus(["A house .", "A cat ."], ["Ein Haus .", "Eine Katze ."], tok)
    assert aligned.pairs == 2 and aligned.result.table.rows == ["<eps>", "a", "house", ".", "cat"]  # 13a, lowercased
    c = Complexity().table_score(aligned.result.exported_table(), aligned.settings)
    r = Reordering().corpus_score(aligned.result.alignments, aligned.settings)
    text = str(c.signature)
    assert "tok:13a" in text and "lc:yes" in text and "aligner:builtin(I5|d|o|v" in text and "log:e" in text
    assert Signature("x", {"tok": "13a"}).comparable(Signature("y", {"tok": "13a"}))
    assert not Signature("x", {"tok": "13a"}).comparable(Signature("x", {"tok": "none"}))
    # FRS's signature names its normalisation, its rules for unaligned words, positions and ties, and what
    # becomes of a sentence with fewer than two aligned words
    assert "|frs:1-(C-1)/(M-1),drop-unaligned,leftmost-target,ties-in-source-order,M<2-skipped|" in str(r.signature)
    assert "|frs:1-D/(M+1),boundary-markers,drop-unaligned,target-span,ties-continuous,nested-spans-skipped," \
           "M<2-scores-1|" in str(Reordering("boundary").corpus_score(aligned.result.alignments).signature)


def test_faithfulness_refuses_corpora_aligned_differently():
    from nat_kd.analysis.align import AlignerOptions

    src, tgt = ["a house .", "a cat ."], ["ein haus .", "eine katze ."]
    tok = get_tokenizer("none")
    real = align_corpus(src, tgt, tok)
    same = align_corpus(src, tgt, tok)
    other = align_corpus(src, tgt, tok, AlignerOptions(favor_diagonal=True))
    assert Faithfulness().corpus_score(real, same).score == pytest.approx(0.0, abs=1e-15)
    assert Complexity().corpus_score(real).score == Complexity().table_score(real.result.exported_table()).score
    with pytest.raises(ValueError, match="not comparable"):
        Faithfulness().corpus_score(real, other)


# ---------------------------------------------------------------- detailed measures (kd-effect analysis)

def test_token_weighted_and_frequency_bucketed_complexity():
    # a: ln 2 (seen 1 time), b: 0 (3 times), c: ln 2 (30 times); d is in the table but was never counted
    t = table({("a", "x"): 0.5, ("a", "y"): 0.5, ("b", "x"): 1.0, ("c", "x"): 0.5, ("c", "y"): 0.5,
               ("d", "x"): 1.0})
    score = Complexity().table_score(t)
    counts = {"a": 1, "b": 3, "c": 30}
    assert score.token_weighted(counts) == pytest.approx(31 * math.log(2) / 34)
    buckets = score.by_frequency(counts, [1, 2, 5, 20])
    assert [b["bucket"] for b in buckets] == ["1", "2-4", "5-19", "20+"]
    assert [b["words"] for b in buckets] == [1, 1, 0, 1]
    assert buckets[0]["complexity"] == pytest.approx(math.log(2)) and buckets[1]["complexity"] == 0.0
    assert math.isnan(buckets[2]["complexity"]) and buckets[3]["complexity"] == pytest.approx(math.log(2))


def test_missing_mass_and_interpolated_faithfulness():
    from nat_kd.analysis.metrics.faithfulness import InterpolatedFaithfulness, missing_mass

    real = table({("a", "x"): 0.5, ("a", "y"): 0.5, ("b", "x"): 1.0})
    distilled = table({("a", "x"): 1.0})  # a lost y; b is missing altogether
    assert missing_mass(real, distilled) == pytest.approx((0.5 + 1.0) / 2)
    # the distilled targets: x three times, z once; vocabulary {x, y, z}: u = (4, 1, 2) / 7
    counts = {"x": 3, "z": 1}
    lam = 0.1
    u = {"x": 4 / 7, "y": 1 / 7}
    q_a = {"x": (1 - lam) * 1.0 + lam * u["x"], "y": lam * u["y"]}
    kl_a = 0.5 * math.log(0.5 / q_a["x"]) + 0.5 * math.log(0.5 / q_a["y"])
    kl_b = math.log(1.0 / (lam * u["x"]))
    score = InterpolatedFaithfulness(lam).table_score(real, distilled, counts)
    assert score.score == pytest.approx((kl_a + kl_b) / 2)
    assert score.missing_words == 1 and "interpolate(0.1" in str(score.signature)
    assert InterpolatedFaithfulness(lam).table_score(real, real, {"x": 2, "y": 1}).score < 0.2


def test_faithfulness_grows_with_the_missing_mass_as_the_floor_falls():
    real = table({("a", "x"): 0.5, ("a", "y"): 0.5})
    distilled = table({("a", "x"): 1.0})
    small, large = Faithfulness(floor=1e-9).table_score(real, distilled), Faithfulness(floor=1e-3).table_score(
        real, distilled)
    # 0.5 of the mass is missing: the difference is 0.5 * ln(1e-3 / 1e-9), up to the rescaling (1 + floor)
    assert small.score - large.score == pytest.approx(0.5 * math.log(1e6), rel=1e-3)


def test_surface_stats_types_tokens_and_repeated_ngrams():
    from nat_kd.analysis.metrics.surface import surface_stats

    lines = ["a man a", "man runs", "", "the the dog", "a man a man"]
    stats = surface_stats(lines, [1, 2, 3])
    assert stats.types == 5 and stats.tokens == 12  # a, man, runs, the, dog
    # a word repeats in sentences 0, 3 and 4; the bigram "a man" in sentence 4 only: the "a" ending sentence 0
    # and the "man" starting sentence 1 are no bigram of sentence 0; no trigram repeats
    assert stats.repeated == {1: pytest.approx(3 / 5), 2: pytest.approx(1 / 5), 3: 0.0}
