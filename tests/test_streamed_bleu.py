"""One streamed BLEU (nat_kd.analysis.metrics.bleu): sacrebleu's corpus and sentence scores from per-line
statistics, summed as the lines go by, against sacrebleu's own on real Multi30k lines."""
import itertools

import pytest
import sacrebleu

from nat_kd.analysis.metrics.bleu import BleuStatistics, ChrfStatistics, streamed_bleu, summed
from nat_kd.corpus import data_dir, iter_lines, split_file

LINES = 1500


@pytest.fixture(scope="module")
def pairs() -> tuple[list[str], list[str]]:
    """Multi30k's first training targets as references, and hypotheses made from them: most lines altered
    (lowercased, shortened, taken from the next line), one empty, one with characters beyond Latin-1."""
    references = list(itertools.islice(iter_lines(split_file(data_dir(), "train", "de")), LINES))
    hypotheses = [ref.lower() if i % 3 == 0 else " ".join(ref.split()[:-2]) if i % 3 == 1 else references[(i + 1) % LINES]
                  for i, ref in enumerate(references)]
    hypotheses[7] = ""
    hypotheses[11] = "Ein Mädchen fährt „Fahrrad“ – 🚲 auf der Straße, 雨の中."
    references[11] = "Ein Mädchen fährt Fahrrad auf der Straße im Regen."
    assert any(not ref.isascii() for ref in references[12:])  # the corpus's own umlauts are in there too
    return hypotheses, references


@pytest.mark.parametrize("lowercase", [False, True])
def test_streamed_bleu_is_sacrebleus_corpus_bleu(pairs, lowercase):
    hypotheses, references = pairs
    expected = sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase)
    got = streamed_bleu(zip(iter(hypotheses), iter(references)), lowercase)  # read once, as from two files
    assert (got.score, got.counts, got.totals, got.sys_len, got.ref_len) == (
        expected.score, expected.counts, expected.totals, expected.sys_len, expected.ref_len)
    assert 10 < got.score < 90


@pytest.mark.slow
def test_line_statistics_give_sacrebleus_sentence_scores_and_their_sums_its_corpus_scores(pairs):
    hypotheses, references = pairs
    bleu, chrf = BleuStatistics(effective_order=True), ChrfStatistics()
    lines = bleu.lines(hypotheses, references)
    assert [bleu.score(line).score for line in lines] == [
        sacrebleu.sentence_bleu(h, [r]).score for h, r in zip(hypotheses, references)]
    assert bleu.score(lines[7]).score == 0.0 and 0 < bleu.score(lines[11]).score < 100
    corpus = BleuStatistics().score(summed([summed(lines[:500]), summed(lines[500:])]))  # two chunks' sums
    assert corpus.score == sacrebleu.corpus_bleu(hypotheses, [references]).score
    chrf_lines = chrf.lines(hypotheses, references)
    assert [chrf.score(line).score for line in chrf_lines[:50]] == [
        sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(hypotheses[:50], references[:50])]
    assert chrf.score(summed(chrf_lines)).score == sacrebleu.corpus_chrf(hypotheses, [references]).score


def test_signatures_are_sacrebleus_against_one_reference():
    assert BleuStatistics(lowercase=True).signature() == "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:" \
        + sacrebleu.__version__
    assert BleuStatistics(effective_order=True).signature().startswith("nrefs:1|case:mixed|eff:yes|")
    assert ChrfStatistics().signature().startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|")
