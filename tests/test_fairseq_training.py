"""fairseq-train and fairseq-generate run our plugins from a plain command line, and lose no sentence (each
student family: tests/test_student_commands.py, from the documented commands)."""
import re

import numpy as np
import pytest
import torch
from conftest import COMMON, MICRO_MODEL, ROOT, TRAIN, TRAIN_SENTENCES, run_fairseq, train_and_decode

import fairseq_plugins  # noqa: F401  (safe checkpoint loading)


@pytest.mark.slow
def test_teacher_trains_and_decodes_every_sentence(tiny_en_de, tmp_path):
    hyps = train_and_decode(tiny_en_de / "bin", tmp_path / "teacher", "kd_transformer_tiny",
                            ("--task", "translation", "--criterion", "label_smoothed_cross_entropy",
                             "--label-smoothing", "0.1"), ("--beam", "2"))
    assert sorted(hyps) == list(range(TRAIN_SENTENCES))


def test_edit_based_students_use_libnat():
    # LevT and InsT compute their edit targets with fairseq's compiled libnat (built for the CPU).
    from fairseq.models.nat.levenshtein_utils import load_libnat

    libnat, use_cuda = load_libnat()
    assert not use_cuda
    # per sentence: what to insert in each slot (before the first token, between tokens, after the last; [1],
    # the placeholder passed, is nothing), then the deletion mask over the input, as worked out by hand: a
    # substitution is a deletion and an insertion, tokens in common stay
    cases = [([5, 6, 7], [5, 8, 7], [[1], [1], [8], [1], [0, 1, 0]]),
             ([5, 7], [5, 8, 9, 7], [[1], [8, 9], [1], [0, 0]]),
             ([5, 6, 9, 7], [5, 7], [[1], [1], [1], [1], [1], [0, 1, 1, 0]])]
    for source, target, path in cases:
        assert libnat.suggested_ed2_path([source], [target], 1) == [path]


@pytest.mark.slow
def test_checkpoint_resumes_and_loads_with_weights_only(tiny_en_de, tmp_path):
    save = tmp_path / "resume"
    flags = ("--task", "translation", "--arch", "kd_transformer_tiny", *MICRO_MODEL,
             "--criterion", "cross_entropy", "--save-dir", save)
    run_fairseq("train", tiny_en_de / "bin", *COMMON, *TRAIN, *flags)
    more = [a if a != "3" else "5" for a in TRAIN]  # --max-update 5
    log = run_fairseq("train", tiny_en_de / "bin", *COMMON, *more, *flags)
    assert "Loaded checkpoint" in log and "@ 3 updates" in log
    state = torch.load(save / "checkpoint_last.pt", weights_only=True)  # what fairseq's loader does
    assert state["optimizer_history"][-1]["num_updates"] == 5


def test_foreign_pickles_are_still_refused(tmp_path):
    from fairseq import checkpoint_utils

    class Evil:
        def __reduce__(self):
            return (print, ("this would have run",))

    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": Evil()}, path)
    with pytest.raises(Exception, match="weights_only"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))


def test_no_sentence_lost_in_training_or_decoding_batches(tiny_en_de):
    from fairseq import tasks
    from fairseq.data import data_utils

    task = tasks.setup_task(_translation_cfg(tiny_en_de / "bin"))
    for split in ("train", "valid"):
        task.load_dataset(split)
        dataset = task.dataset(split)
        batches = task.get_batch_iterator(dataset, max_tokens=1024, required_batch_size_multiple=1,
                                          seed=1, ignore_invalid_inputs=False).next_epoch_itr(shuffle=True)
        ids = np.concatenate([batch["id"].numpy() for batch in batches])
        assert sorted(ids.tolist()) == list(range(len(dataset)))

    # Why every command passes the flag: fairseq's default of 8 drops the last batch (the longest sentences).
    # 203 sentences in batches of at most 16 sentences, each a multiple of 8: 12 of 16, one of 8, and a
    # last one of 3, which fairseq drops: the 3 longest sentences of the split.
    dataset = task.dataset("train")
    order = dataset.ordered_indices()
    default = data_utils.batch_by_size(order, dataset.num_tokens, max_sentences=16, required_batch_size_multiple=8)
    assert sum(len(b) for b in default) == 200
    assert set(order[-3:]).isdisjoint(np.concatenate(default))
    ours = data_utils.batch_by_size(order, dataset.num_tokens, max_sentences=16, required_batch_size_multiple=1)
    assert sum(len(b) for b in ours) == 203


def _translation_cfg(bin_dir):
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.options import get_training_parser, parse_args_and_arch

    args = parse_args_and_arch(get_training_parser(), [str(bin_dir), "--task", "translation",
                                                       "--arch", "kd_transformer_tiny"])
    return convert_namespace_to_omegaconf(args).task


# a line that runs fairseq (in a script or a shell example), not prose that names the tool
COMMAND_LINE = re.compile(r"^\s*(\$ )?(nice (-n ?\d+ )?)?(timeout \d+ )?`?fairseq-(train|generate|interactive)\s")


def test_every_documented_fairseq_command_keeps_all_sentences():
    documents = [ROOT / "README.md", *sorted((ROOT / "scripts").rglob("*.sh")), *sorted((ROOT / "docs").rglob("*.md"))]
    commands = []
    for document in documents:
        text = document.read_text(encoding="utf-8").replace("\\\n", " ")
        commands += [(document.name, line) for line in text.splitlines()
                     if COMMAND_LINE.search(line)]
    assert commands, "the README documents fairseq-train and fairseq-generate commands"
    missing = [f"{name}: {line.strip()[:100]}" for name, line in commands
               if "--required-batch-size-multiple 1" not in line]
    assert not missing, "commands without --required-batch-size-multiple 1:\n" + "\n".join(missing)
