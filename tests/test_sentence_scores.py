"""Per-sentence scores (scores.tsv) and the frequency-bucket table, against values worked out by hand."""
import math

import numpy as np
import pytest
import sacrebleu

from nat_kd.analysis.formats import Alignments
from nat_kd.analysis.metrics.frequency import Vocabulary, frequency_table, linked_pairs
from nat_kd.analysis.metrics.sentence import SentenceScorer, SentenceScores, sacrebleu_statistics, summary
from nat_kd.analysis.metrics.surface import repeated_ngram_counts, surface_stats
from nat_kd.corpus import CorpusError


def test_every_column_by_hand():
    hyps = ["a b c d", "a b", "ab", "Ein Mann ein Mann .", ""]
    refs = ["a b c e", "a b c", "ac", "Ein Mann .", "x y"]
    scores = SentenceScorer().score(hyps, refs, logprobs=[-0.5, -1.0, -1.5, -2.0, -2.5])
    # line 1: 1- to 4-gram precisions 3/4, 2/3, 1/2 and 0/1, which sacrebleu's exp smoothing makes 1/2;
    # same length, so no brevity penalty: 100 * (3/4 * 2/3 * 1/2 * 1/2) ** (1/4) = 100 * 2 ** (-3/4)
    assert scores["bleu"][0] == pytest.approx(100 * 2 ** -0.75)
    # line 2: only 1- and 2-grams exist (effective order 2), both all matched; brevity penalty exp(1 - 3/2)
    assert scores["bleu"][1] == pytest.approx(100 * math.exp(-0.5))
    assert scores["bleu"][4] == 0.0
    # line 3, chrF: characters a,b against a,c: P = R = 1/2; bigram ab against ac: P = R = 0; no longer
    # n-grams. Averages over the 2 orders: P = R = 1/4, F_2 = 5 P R / (4 P + R) = 0.3125 / 1.25 = 1/4
    assert scores["chrf"][2] == pytest.approx(25.0)
    assert scores["chrf"][4] == 0.0
    assert scores["length_ratio"].tolist() == [1.0, 2 / 3, 1.0, 5 / 3, 0.0]
    # lowercased 13a tokens "ein mann ein mann .": the bigram "ein mann" starts twice: 1 repeat
    assert scores["repeated_ngrams"].tolist() == [0, 0, 0, 1, 0]
    assert scores["repeated"].tolist() == [0, 0, 0, 1, 0]
    assert scores["logprob"].tolist() == [-0.5, -1.0, -1.5, -2.0, -2.5]
    with pytest.raises(CorpusError, match="analyze sentences"):
        scores["frs"]


def test_sentence_scores_are_sacrebleus_sentence_scores(tiny_en_de):
    refs = (tiny_en_de / "raw" / "valid.de").read_text(encoding="utf-8").splitlines()[:60]
    hyps = [" ".join(r.split()[: 2 + i % 7]) for i, r in enumerate(refs)]
    scores = SentenceScorer().score(hyps, refs)
    assert scores["bleu"].tolist() == [sacrebleu.sentence_bleu(h, [r]).score for h, r in zip(hyps, refs)]
    assert scores["chrf"].tolist() == [sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(hyps, refs)]
    # the statistics the generator sums into its corpus scores are these very ones
    stats = sacrebleu_statistics(hyps, refs)
    assert SentenceScorer().score(hyps, refs, statistics=stats)["bleu"].tolist() == scores["bleu"].tolist()


def test_repeated_ngram_counts_by_hand():
    lines = ["a b a b a b", "a a a", "a b c", "", "x"]
    # bigrams of line 1: ab ba ab ba ab: 2 distinct of 5 -> 3 repeats; line 2: aa aa -> 1
    assert repeated_ngram_counts(lines, 2).tolist() == [3, 1, 0, 0, 0]
    # unigrams: line 1 has 6 tokens of 2 types -> 4; line 2: 3 of 1 -> 2
    assert repeated_ngram_counts(lines, 1).tolist() == [4, 2, 0, 0, 0]
    # the corpus share is the mean of the flags
    assert surface_stats(lines, [2]).repeated[2] == pytest.approx(2 / 5)


def test_scores_tsv_round_trip_and_damaged_file(tmp_path):
    scores = SentenceScorer().score(["a b a b", "c"], ["a b", "c"], logprobs=[-1.25, -0.5])
    scores = scores.with_column("frs", [1.0, float("nan")])
    path = tmp_path / "scores.tsv"
    scores.write(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "line\tbleu\tchrf\tlength_ratio\trepeated_ngrams\trepeated\tlogprob\tfrs"
    assert lines[1].split("\t")[0] == "1" and lines[1].split("\t")[4:7] == ["1", "1", "-1.25"]
    assert lines[2].endswith("\tnan")
    back = SentenceScores.read(path)
    assert back["logprob"].tolist() == [-1.25, -0.5] and np.isnan(back["frs"][1])
    assert summary(back)["frs"]["lines"] == 1
    path.write_text(lines[0] + "\n1\t1\n")
    with pytest.raises(CorpusError, match=r"scores.tsv:2: expected 8 tab-separated cells"):
        SentenceScores.read(path)


def test_frequency_buckets_by_hand():
    # real data: a (3 times) linked to x, x, w; b (once) to y; c (once) to z
    real = [(["a", "b"], ["x", "y"]), (["a", "c"], ["x", "z"]), (["a"], ["w"])]
    # distilled: b now linked to x, a only to x; c keeps z
    distilled = [(["a", "b"], ["x", "x"]), (["a", "c"], ["x", "z"]), (["a"], ["x"])]
    links = Alignments(np.array([0, 0, 1, 1, 2]), np.array([0, 1, 0, 1, 0]), np.array([0, 1, 0, 1, 0]), 3)
    # the links given in two shards (sentences 0-1 and 2, each numbered from its own first)
    shards = [Alignments(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), np.array([0, 1, 0, 1]), 2),
              Alignments(np.array([0]), np.array([0]), np.array([0]), 1)]
    src, tgt = Vocabulary(), Vocabulary()
    real_links = linked_pairs(real, [links], src, tgt)
    assert len(real_links) == 4  # (a,x) (b,y) (c,z) (a,w)
    distilled_links = linked_pairs(distilled, shards, src, tgt)
    assert len(distilled_links) == 3  # (a,x) (b,x) (c,z)
    counts = {src.ids["a"]: 3, src.ids["b"]: 1, src.ids["c"]: 1}
    complexity = [{"complexity": 0.25}, {"complexity": 0.5}]
    rows = frequency_table(counts, [1, 2], real_links, distilled_links, complexity)
    assert [r.bucket for r in rows] == ["1", "2+"]
    assert [r.words for r in rows] == [2, 1]
    assert [r.complexity for r in rows] == [0.25, 0.5]
    # bucket 1: (b,y) lost, (c,z) kept; b loses its only translation
    assert (rows[0].real_pairs, rows[0].kept, rows[0].words_losing_all) == (2, 0.5, 1)
    # bucket 2+: (a,x) kept, (a,w) lost; a keeps one
    assert (rows[1].real_pairs, rows[1].kept, rows[1].words_losing_all) == (2, 0.5, 0)
    # the real data against itself keeps everything
    itself = frequency_table(counts, [1, 2], real_links, real_links, complexity)
    assert [(r.kept, r.words_losing_all) for r in itself] == [(1.0, 0), (1.0, 0)]


def test_the_cards_repeated_outputs_by_hand():
    from nat_kd.analysis.card import repeated_outputs

    target = ["ein mann ein mann .", "Ein Hund .", "ein mann ein mann .", "zwei hunde zwei hunde zwei hunde", "x"]
    reference = ["ein mann .", "ein hund .", "a b a b", "zwei hunde", "x"]
    scores = SentenceScorer().score(target, reference)
    rep = repeated_outputs(target, scores, reference)
    assert (rep["n"], rep["lines"], rep["share"], rep["reference_share"]) == (2, 3, 3 / 5, 1 / 5)
    # "ein mann" repeats in two outputs; "zwei hunde" and "hunde zwei" in one (each counted once per line)
    assert rep["most_repeated_ngrams"][0] == ("ein mann", 2)
    assert sorted(rep["most_repeated_ngrams"][1:]) == [("hunde zwei", 1), ("zwei hunde", 1)]
    assert rep["most_frequent_outputs"] == [("ein mann ein mann .", 2)]


def test_the_cards_histograms_clip_their_axis_at_a_percentile():
    from nat_kd.analysis.card import HISTOGRAM_PERCENTILE, histogram_axis

    ratios = np.concatenate([np.linspace(0.8, 1.2, 999), [17.0]])  # one runaway line, as in the main job's set
    low, high, outside = histogram_axis(ratios)
    assert HISTOGRAM_PERCENTILE == 99.5
    assert 0.8 < low < 0.81 and 1.19 < high < 1.2 and outside == 10  # 5 off each end of 1,000 lines
    assert histogram_axis(np.array([])) == (0.0, 1.0, 0)
