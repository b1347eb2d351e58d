"""Selective KD as NJUNLP/SelectiveKD trains it: the evaluator's CTC-aligned accuracy on a hand-made example,
the threshold at hand-computed updates, each sentence's target by the threshold, and a set whose accuracies a
micro evaluator computed, trained on with the task."""
import json
import re
import shutil

import numpy as np
import pytest
import torch

import fairseq_plugins  # noqa: F401  (registers the tasks and the students)
from fairseq_plugins.models.ctc import ctc_alignment_accuracy
from fairseq_plugins.tasks import kd_threshold_at, selective_targets

from conftest import MICRO_MODEL, ROOT, TRAIN_SENTENCES, run_fairseq, write_distilled

BLANK, A, B = 0, 1, 2
# each position's probabilities of (blank, a, b)
PROBABILITIES = [(0.1, 0.4, 0.5), (0.3, 0.6, 0.1), (0.5, 0.1, 0.4), (0.3, 0.1, 0.6), (0.6, 0.1, 0.3)]


def test_the_evaluators_accuracy_is_its_argmax_against_the_best_ctc_alignment():
    """Target "a b" on 5 positions: the argmax reads b a _ b _, which is no alignment of it (b before a). The
    best alignment is a a _ b _ (0.4 x 0.6 x 0.5 x 0.6 x 0.6 = 0.0432; next a a b b _, 0.0346): 4 of the 5
    positions agree, 0.8. On the first 4 positions only (a shorter sentence): a a _ b (0.072; next a a b b,
    0.0576) against b a _ b, 3 of 4, 0.75. "a a b" cannot fit 3 positions (a blank must part the two a's): 0."""
    log_probs = torch.tensor(PROBABILITIES).log().unsqueeze(0).repeat(3, 1, 1)
    targets = torch.tensor([[A, B, B], [A, B, B], [A, A, B]])  # the first two: length 2, padded
    accuracy = ctc_alignment_accuracy(log_probs, torch.tensor([5, 4, 3]), targets, torch.tensor([2, 2, 3]), BLANK)
    assert accuracy.tolist() == pytest.approx([0.8, 0.75, 0.0])


def test_the_threshold_rises_with_the_update():
    """kd_threshold + update / updates x offset: the README's 0.4 and 0.6 over 2,000 updates."""
    assert [kd_threshold_at(u, 0.4, 0.6, 2000) for u in (0, 500, 1000, 2000)] == pytest.approx([0.4, 0.55, 0.7, 1.0])
    assert kd_threshold_at(150_000, 0.3, 0.0, 300_000) == 0.3  # the code's own defaults: a fixed threshold


def test_a_sentence_the_evaluator_is_poor_on_takes_its_distilled_target():
    """The evaluator's accuracy on each raw target 0.1, 0.5, 0.9: at threshold 0.4 only the first (the line it
    is poor on) takes the distilled target, at 0.7 the first two; the rest keep their raw target."""
    pad = 1
    distilled = torch.tensor([[0, 10, 11, 2], [0, 12, 2, pad], [0, 13, 2, pad]])
    raw = torch.tensor([[0, 20, 2, pad, pad], [0, 21, 22, 23, 2], [0, 24, 25, 2, pad]])
    accuracy = torch.tensor([0.1, 0.5, 0.9])
    targets, use_kd = selective_targets(distilled, raw, accuracy, kd_threshold_at(0, 0.4, 0.6, 2000), pad)
    assert use_kd.tolist() == [True, False, False]
    assert targets.tolist() == [[0, 10, 11, 2, pad], [0, 21, 22, 23, 2], [0, 24, 25, 2, pad]]
    targets, use_kd = selective_targets(distilled, raw, accuracy, kd_threshold_at(1000, 0.4, 0.6, 2000), pad)
    assert use_kd.tolist() == [True, True, False]
    assert targets.tolist() == [[0, 10, 11, 2], [0, 12, 2, pad], [0, 24, 25, 2]]


@pytest.mark.slow
def test_a_selective_kd_set_holds_the_evaluators_accuracy_on_each_raw_target_and_trains(tiny_en_de, tmp_path,
                                                                                        capsys):
    """A hand-made distilled set of the training split, a CTC-with-glancing evaluator of a few updates on it: the
    set's accuracy file holds, line by line, the evaluator's accuracy on each raw target computed one sentence
    at a time; meta.json records its digest; fairseq-train with the task trains on it."""
    from fairseq.data import Dictionary, data_utils

    from nat_kd.distill.source import load_binarized
    from nat_kd.hashing import sha256_file
    from nat_kd.selective_kd import load_evaluator, main

    kd = tmp_path / "kd"
    refs, targets = write_distilled(tiny_en_de, kd, split="train")
    evaluator = tmp_path / "evaluator"
    common = ["--user-dir", ROOT / "fairseq_plugins", "--noise", "full_mask", "--arch", "kd_glat_ctc_tiny",
              *MICRO_MODEL, "--label-smoothing", "0", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "1024",
              "--required-batch-size-multiple", "1", "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1",
              "--log-format", "simple", "--log-interval", "1", "--no-progress-bar"]
    run_fairseq("train", kd / "bin", *common, "--task", "kd_translation_lev", "--criterion", "nat_loss",
                "--max-update", "4", "--save-dir", evaluator)
    out = tmp_path / "skd"
    assert main(["--distilled", str(kd), "--prepared", str(tiny_en_de), "--evaluator",
                 str(evaluator / "checkpoint_last.pt"), "--out", str(out), "--max-tokens", "300"]) == 0
    assert f"over {TRAIN_SENTENCES} lines" in capsys.readouterr().out
    accuracy_file = out / "bin" / "train.evaluator_accuracy.txt"
    stored = np.loadtxt(accuracy_file)
    model = load_evaluator(evaluator / "checkpoint_last.pt", kd / "bin")
    dictionary = Dictionary.load(str(kd / "bin" / "dict.de.txt"))
    sources = load_binarized(kd / "bin", "train", "en", "en-de", Dictionary.load(str(kd / "bin" / "dict.en.txt")))
    raw = data_utils.load_indexed_dataset(str(out / "bin" / "train.raw.en-de.de"), dictionary)
    assert [dictionary.string(raw[i]) for i in range(len(raw))] == [
        dictionary.string(dictionary.encode_line(line, add_if_not_exist=False))
        for line in (tiny_en_de / "spm" / "train.de").read_text(encoding="utf-8").splitlines()]
    with torch.no_grad():
        one_by_one = [model.alignment_accuracy(s.long().unsqueeze(0), torch.tensor([len(s)]),
                                               torch.cat([torch.tensor([dictionary.bos()]), raw[i].long()])
                                               .unsqueeze(0)).item() for i, s in enumerate(sources)]
    assert len(stored) == TRAIN_SENTENCES and stored == pytest.approx(one_by_one, abs=2e-6)
    assert stored.max() < 1  # the micro evaluator is poor
    meta = json.loads((out / "meta.json").read_text())
    record = meta["selective_kd"]
    assert record["accuracy_sha256"] == sha256_file(accuracy_file) and record["lines"] == TRAIN_SENTENCES
    assert record["evaluator_sha256"] == sha256_file(evaluator / "checkpoint_last.pt")
    assert record["mean_accuracy"] == round(float(stored.mean()), 4) and meta["strategy"] == "beam+selective-kd"
    assert (out / "train.de").read_text(encoding="utf-8").splitlines() == targets  # the set is the distilled set
    assert (out / "train.raw.de").read_text(encoding="utf-8").splitlines() == refs
    # a store keeps its meta.json and the accuracies alone; the rest is rebuilt byte for byte
    from nat_kd.engine.steps import kept_selection, rebuild_selection

    kept = kept_selection(tmp_path, {"dir": str(out), "outputs": [str(accuracy_file)]})
    assert sorted(map(str, kept.files)) == ["skd/bin/train.evaluator_accuracy.txt", "skd/meta.json"]
    restored = tmp_path / "restored"
    for file in kept.files:
        (restored / "data" / file.relative_to("skd")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / file, restored / "data" / file.relative_to("skd"))
    rebuild_selection(restored, {"kd": {"dir": str(kd)}, "prepare": {"dir": str(tiny_en_de)}}, of="kd",
                      prepare="prepare")
    assert sorted((str(f.relative_to("skd")), (tmp_path / f).read_bytes()) for f in kept.files + kept.rebuilt) == sorted(
        (str(p.relative_to(restored / "data")), p.read_bytes()) for p in (restored / "data").rglob("*") if p.is_file())
    # a threshold above every accuracy: every sentence takes its distilled target; below every one: none
    for threshold, share in ((stored.max() + 1e-3, 1.0), (stored.min() - 1e-3, 0.0)):
        log = run_fairseq("train", out / "bin", *common, "--task", "selective_kd_translation_lev", "--criterion",
                          "nat_loss", "--kd-threshold", threshold, "--kd-threshold-offset", 0, "--max-update", "2",
                          "--save-dir", tmp_path / f"student{share}", "--disable-validation")
        shares = [float(s) for s in re.findall(r"train_inner.*?\bdistilled_share=([0-9.]+)", log)]
        assert len(shares) == 2 and set(shares) == {share}, log[-2000:]
