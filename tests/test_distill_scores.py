"""meta.json's BLEU and chrF, summed chunk by chunk from sacrebleu's statistics, against corpus_score."""
import sacrebleu

from nat_kd.distill.scores import scores, statistics


def test_chunked_scores_equal_sacrebleus_corpus_score(tiny_en_de):
    refs = (tiny_en_de / "raw" / "valid.de").read_text(encoding="utf-8").splitlines()
    # hypotheses of every kind of quality: exact, another sentence, a truncated one, an empty one
    hyps = [r if i % 3 == 0 else refs[(i + 1) % len(refs)] if i % 3 == 1 else " ".join(r.split()[:3])
            for i, r in enumerate(refs)]
    hyps[5] = ""
    cuts = [0, 7, 300, 301, len(refs)]
    parts = [statistics(hyps[a:b], refs[a:b]) for a, b in zip(cuts, cuts[1:])]
    got = scores(parts, hyps, refs)
    bleu, chrf = sacrebleu.BLEU().corpus_score(hyps, [refs]), sacrebleu.CHRF().corpus_score(hyps, [refs])
    assert got["bleu"] == round(bleu.score, 4) and got["chrf"] == round(chrf.score, 4)
    assert 10 < got["bleu"] < 90 and 10 < got["chrf"] < 90
    assert got["length_ratio_corpus"] == round(bleu.sys_len / bleu.ref_len, 4)
    assert got["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    # one sentence: its ratio by hand
    one = scores([statistics(["a b c"], ["a b c d"])], ["a b c"], ["a b c d"])
    assert one["mean_length_ratio"] == 0.75 and one["length_ratio_corpus"] == 0.75
    assert scores([], [], None) == {}
