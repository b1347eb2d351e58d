"""Word-level KD: the loss by hand, its limits, offline == online, teacher frozen, fairseq-train end to end."""
import math

import numpy as np
import pytest
import torch

import fairseq_plugins  # noqa: F401  (registers architectures and criteria, safe checkpoint loading)
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.data import Dictionary
from fairseq_plugins.criterions.nat_word_kd import at_inputs_from_nat_sample
from fairseq_plugins.teacher import TeacherEnsemble, TeacherError, check_same_dictionary
from fairseq_plugins.criterions.word_kd import WordKDConfig, WordKDCriterion, soft_kl, word_kd_loss
from fairseq_plugins.criterions.topk import TopKError
from nat_kd.teacher_topk import compute_teacher_topk

from conftest import MICRO_MODEL

LN2 = math.log(2)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These models are tiny: on 2 shared cores, one thread runs them ~4x faster than two fighting ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- the loss on a 3-token vocabulary, by hand
# student p = (1/4, 1/2, 1/4) from logits (0, ln 2, 0); teacher q = (1/2, 1/4, 1/4); reference token 1
STUDENT = torch.tensor([[0.0, LN2, 0.0]])
TEACHER = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
TARGET = torch.tensor([1])


def test_hand_computed_loss_at_temperature_one():
    out = word_kd_loss(STUDENT, TARGET, TEACHER, alpha=0.5, temperature=1.0, epsilon=0.0)
    hard = -math.log(0.5)  # ln 2
    kl = 0.5 * math.log(0.5 / 0.25) + 0.25 * math.log(0.25 / 0.5) + 0.25 * math.log(0.25 / 0.25)
    assert out["hard"].item() == pytest.approx(hard)
    assert out["soft"].item() == pytest.approx(kl)  # = 0.25 ln 2
    assert out["loss"].item() == pytest.approx(0.5 * hard + 0.5 * kl)
    assert out["agree"].item() == 0  # student's top-1 is token 1, teacher's token 0


def test_hand_computed_label_smoothing_matches_fairseq_convention():
    # fairseq: (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum_v -log p_v, here V=3, eps=0.1
    out = word_kd_loss(STUDENT, TARGET, TEACHER, alpha=1.0, temperature=1.0, epsilon=0.1)
    expected = 0.85 * LN2 + 0.05 * (2 * LN2 + LN2 + 2 * LN2)
    assert out["hard"].item() == pytest.approx(expected)
    assert out["loss"].item() == pytest.approx(expected)
    assert out["nll"].item() == pytest.approx(LN2)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_soft_loss_is_t_squared_times_kl_of_tempered_distributions(temperature):
    p = np.array([1.0, 2.0, 1.0]) ** (1 / temperature)  # softmax((0, ln 2, 0) / T), unnormalised
    q = np.array([0.5, 0.25, 0.25]) ** (1 / temperature)
    p, q = p / p.sum(), q / q.sum()
    kl = float((q * np.log(q / p)).sum())
    out = word_kd_loss(STUDENT, TARGET, TEACHER, alpha=0.0, temperature=temperature, epsilon=0.0)
    assert out["soft"].item() == pytest.approx(temperature ** 2 * kl, rel=1e-5)
    assert out["loss"].item() == pytest.approx(temperature ** 2 * kl, rel=1e-5)


def test_topk_renormalises_over_kept_tokens_and_full_k_equals_dense():
    full = soft_kl(STUDENT, TEACHER, 2.0)
    index = torch.tensor([[0, 1, 2]])
    assert soft_kl(STUDENT, TEACHER.gather(-1, index), 2.0, index).item() == pytest.approx(full.item())
    top2 = soft_kl(STUDENT, TEACHER[:, :2], 1.0, torch.tensor([[0, 1]]))
    # q = (2/3, 1/3) over tokens {0, 1}; p read there: (1/4, 1/2)
    assert top2.item() == pytest.approx(2 / 3 * math.log((2 / 3) / 0.25) + 1 / 3 * math.log((1 / 3) / 0.5))


# ---------------------------------------------------------------- errors
def test_dictionary_mismatch_names_both_sizes_and_the_fix():
    teacher, student = Dictionary(), Dictionary()
    for sym in "a b c".split():
        teacher.add_symbol(sym)
    for sym in "a c".split():
        student.add_symbol(sym)
    with pytest.raises(TeacherError, match=r"7 entries.*6 entries.*index 5 \('b' vs 'c'\).*--srcdict/--tgtdict"):
        check_same_dictionary("target", teacher, student, "t.pt", "data x")
    check_same_dictionary("target", student, student, "t.pt", "data x")  # same dictionary: no error


def test_missing_teacher_checkpoint_is_named(tmp_path):
    with pytest.raises(TeacherError, match=r"nowhere\.pt does not exist.*--teacher-path"):
        TeacherEnsemble.load(str(tmp_path / "nowhere.pt"))


def test_precompute_refuses_an_out_folder_that_holds_other_files_before_the_teacher_runs(tmp_path):
    from nat_kd.errors import SettingsError

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(SettingsError, match=r"--out .*mine exists and is not a teacher top-k folder \(no meta\.json\)"):
        compute_teacher_topk(tmp_path / "bin", str(tmp_path / "nowhere.pt"), out)
    assert (out / "notes.txt").read_text() == "keep me"


# ---------------------------------------------------------------- with a micro teacher on a tiny slice
def fairseq_train(*args) -> dict:
    """fairseq-train in this process (a subprocess would import fairseq again: ~10 s on 2 shared cores).

    Returns the last checkpoint's training metrics, name -> meter state."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    args = [*map(str, args), "--user-dir", "fairseq_plugins", *MICRO_MODEL, "--optimizer", "adam",
            "--max-tokens", "2048", "--required-batch-size-multiple", "1", "--no-epoch-checkpoints", "--seed", "1",
            "--cpu", "--num-workers", "0"]
    train.main(convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args)))
    save_dir = args[args.index("--save-dir") + 1]
    state = torch.load(f"{save_dir}/checkpoint_last.pt", weights_only=True)
    return {name: meter for _, name, _, meter in state["extra_state"]["metrics"]["train"]}


@pytest.fixture(scope="module")
def micro_teacher(tiny_en_de, tmp_path_factory):
    save = tmp_path_factory.mktemp("teacher")
    fairseq_train(tiny_en_de / "bin", "--task", "translation", "--arch", "kd_transformer_tiny", "--lr", "5e-3",
                  "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-update", "15",
                  "--save-dir", save, "--disable-validation")
    return save / "checkpoint_last.pt"


def translation_task_and_batch(data_bin, split="train", max_tokens=600):
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    task = TranslationTask.setup_task(TranslationConfig(data=str(data_bin), source_lang="en", target_lang="de",
                                                        dataset_impl=None, required_seq_len_multiple=1))
    task.load_dataset(split)
    batches = task.get_batch_iterator(task.dataset(split), max_tokens=max_tokens, required_batch_size_multiple=1,
                                      ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
    return task, next(batches)


def kd_criterion(task, **overrides):
    cfg = WordKDConfig(sentence_avg=False, label_smoothing=0.1, **overrides)
    return WordKDCriterion(cfg, task)


def random_student(task, checkpoint):
    """A randomly initialised model of the micro teacher's shape, without dropout (deterministic in train mode)."""
    from fairseq import checkpoint_utils

    cfg = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["cfg"].model
    cfg.dropout = 0.0
    return task.build_model(cfg)


@pytest.mark.slow
def test_alpha_one_equals_fairseqs_label_smoothed_cross_entropy(tiny_en_de, micro_teacher):
    task, sample = translation_task_and_batch(tiny_en_de / "bin")
    (student,) = TeacherEnsemble.load(str(micro_teacher)).models  # any model will do; a fresh copy of the teacher here
    ours, _, log = kd_criterion(task, teacher_path=str(micro_teacher), kd_alpha=1.0, kd_temperature=2.0)(student, sample)
    fairseqs, _, _ = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)(student, sample)
    assert ours.item() == pytest.approx(fairseqs.item(), rel=1e-6)
    # the student is the teacher: its soft loss is zero and it agrees with itself everywhere
    assert log["kd_soft"].item() == pytest.approx(0.0, abs=1e-4)
    assert log["kd_agree"] == log["kd_tokens"] == sample["ntokens"]


@pytest.fixture(scope="module")
def full_topk(tiny_en_de, micro_teacher, tmp_path_factory):
    """The micro teacher's whole distribution for the training slice, in float32 and float16."""
    vocab = len(Dictionary.load(str(tiny_en_de / "bin" / "dict.de.txt")))
    out = tmp_path_factory.mktemp("topk")
    return {dtype: compute_teacher_topk(tiny_en_de / "bin", str(micro_teacher), out / dtype, k=vocab,
                                        splits=("train",), dtype=dtype) for dtype in ("float32", "float16")}


@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-6), ("float16", 1e-4)])
def test_offline_equals_online_when_k_covers_the_vocabulary(tiny_en_de, micro_teacher, full_topk, dtype, tolerance):
    task, sample = translation_task_and_batch(tiny_en_de / "bin")
    student = random_student(task, micro_teacher).train()  # training: the offline criterion reads 'train' rows
    online = kd_criterion(task, teacher_path=str(micro_teacher), kd_alpha=0.3, kd_temperature=2.0)
    offline = kd_criterion(task, teacher_topk_path=str(full_topk[dtype]), kd_alpha=0.3, kd_temperature=2.0)
    loss_on, _, log_on = online(student, sample)
    loss_off, _, log_off = offline(student, sample)
    assert log_on["kd_soft"].item() > 0.1  # a random student: far from the teacher
    assert loss_off.item() == pytest.approx(loss_on.item(), rel=tolerance)
    assert log_off["kd_soft"].item() == pytest.approx(log_on["kd_soft"].item(), rel=tolerance)
    assert log_off["kd_agree"] == log_on["kd_agree"]


def test_small_k_differs_and_rows_must_match_the_data(tiny_en_de, micro_teacher, full_topk, tmp_path):
    task, sample = translation_task_and_batch(tiny_en_de / "bin")
    student = random_student(task, micro_teacher).train()
    top2 = compute_teacher_topk(tiny_en_de / "bin", str(micro_teacher), tmp_path / "top2", k=2, splits=("train",))
    _, _, log_full = kd_criterion(task, teacher_topk_path=str(full_topk["float32"]), kd_temperature=2.0)(student, sample)
    criterion = kd_criterion(task, teacher_topk_path=str(top2), kd_temperature=2.0)
    _, _, log_top2 = criterion(student, sample)
    # teacher renormalised over 2 tokens, student not: another soft loss, so offline == online above can fail
    assert abs(log_top2["kd_soft"].item() - log_full["kd_soft"].item()) > 0.1 * log_full["kd_soft"].item()
    assert np.load(top2 / "train.index.npy", mmap_mode="r").dtype == np.uint16
    sample["id"] = sample["id"] + 1  # other sentences than the batch's: lengths disagree somewhere
    with pytest.raises(TopKError, match="computed on other data"):
        criterion(student, sample)
    with pytest.raises(TopKError, match="no 'valid' split"):
        criterion(student.eval(), sample)


def test_gradients_reach_the_student_only(tiny_en_de, micro_teacher):
    task, sample = translation_task_and_batch(tiny_en_de / "bin")
    student = random_student(task, micro_teacher).train()
    criterion = kd_criterion(task, teacher_path=str(micro_teacher), kd_alpha=0.0, kd_temperature=2.0)
    (teacher,) = criterion.teacher.ensemble.models
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    optimizer = torch.optim.SGD(student.parameters(), lr=1.0)
    loss, _, _ = criterion(student, sample)
    loss.backward()
    assert all(p.grad is not None for p in student.parameters() if p.requires_grad)
    assert sum(p.grad.abs().sum().item() for p in student.parameters()) > 0  # alpha=0: from the soft loss alone
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not teacher.training
    # nothing of the teacher is part of the criterion: fairseq would otherwise save/optimise it
    assert list(criterion.parameters()) == [] and criterion.state_dict() == {}


def test_nat_sample_becomes_the_teachers_own_batch(tiny_en_de):
    """Stripping translation_lev's <s> gives exactly what the translation task batches for the same sentences."""
    from fairseq.tasks.translation_lev import TranslationLevenshteinConfig, TranslationLevenshteinTask

    at_task, at_sample = translation_task_and_batch(tiny_en_de / "bin", max_tokens=400)
    nat_task = TranslationLevenshteinTask.setup_task(TranslationLevenshteinConfig(
        data=str(tiny_en_de / "bin"), source_lang="en", target_lang="de", dataset_impl=None,
        required_seq_len_multiple=1))
    nat_task.load_dataset("train")
    dataset = nat_task.dataset("train")
    nat_sample = dataset.collater([dataset[i] for i in at_sample["id"].tolist()])
    d = nat_task.target_dictionary
    src, src_lengths, prev, target = at_inputs_from_nat_sample(nat_sample, d.bos(), d.eos(), d.pad())
    # both collaters sort by source length; match rows by sentence id
    row = {i: r for r, i in enumerate(at_sample["id"].tolist())}
    order = torch.tensor([row[i] for i in nat_sample["id"].tolist()])
    net_input = at_sample["net_input"]
    assert len(order) == len(at_sample["id"]) > 1
    assert torch.equal(src, net_input["src_tokens"][order])
    assert torch.equal(src_lengths, net_input["src_lengths"][order])
    assert torch.equal(prev, net_input["prev_output_tokens"][order])
    assert torch.equal(target, at_sample["target"][order])


# ---------------------------------------------------------------- fairseq-train end to end
KD_FLAGS = ("--kd-alpha", "0.5", "--kd-temperature", "2", "--label-smoothing", "0.1", "--lr", "1e-3",
            "--max-update", "3", "--max-valid-steps", "1")


def test_fairseq_train_at_student_online_and_offline(tiny_en_de, micro_teacher, full_topk, tmp_path):
    at = ("--task", "translation", "--arch", "kd_transformer_tiny", "--criterion", "word_kd", *KD_FLAGS)
    meters = fairseq_train(tiny_en_de / "bin", *at, "--teacher-path", micro_teacher, "--save-dir", tmp_path / "on")
    assert {"hard_loss", "soft_loss", "kd_agree", "kd_tokens"} <= set(meters)
    assert meters["soft_loss"]["sum"] > 0 and meters["kd_tokens"]["sum"] > 0
    # the student's checkpoint holds the micro student only: no teacher weights anywhere
    state = torch.load(tmp_path / "on" / "checkpoint_last.pt", weights_only=True)
    teacher_state = torch.load(micro_teacher, weights_only=True)["model"]
    assert set(state["model"]) == set(teacher_state) and not state.get("criterion")
    student_values = sum(v.numel() for v in state["model"].values())
    assert student_values == sum(v.numel() for v in teacher_state.values())  # one model's worth, not two

    # offline from the float32 file of train rows; validation has no 'valid' rows and runs the teacher online
    meters = fairseq_train(tiny_en_de / "bin", *at, "--teacher-topk-path", full_topk["float32"],
                           "--teacher-path", micro_teacher, "--save-dir", tmp_path / "off")
    assert meters["soft_loss"]["sum"] > 0


@pytest.mark.parametrize("family", ["nat", "cmlm", "inat"])
@pytest.mark.slow
def test_fairseq_train_nat_student(tiny_en_de, micro_teacher, tmp_path, family):
    from fairseq_plugins.models.nat import STUDENT_FAMILIES

    meters = fairseq_train(tiny_en_de / "bin", "--task", "translation_lev", "--arch", f"kd_{family}_tiny",
                           *STUDENT_FAMILIES[family].train_flags, "--criterion", "nat_word_kd", *KD_FLAGS,
                           "--teacher-path", micro_teacher, "--save-dir", tmp_path / "nat")
    assert {"word_ins", "length", "word_kd_soft", "kd_agree"} <= set(meters)
    assert meters["word_kd_soft"]["sum"] > 0 and meters["length"]["sum"] > 0


@pytest.mark.parametrize("outputs", [{"ctc": {"loss": torch.tensor(1.0), "factor": 1.0}},
                                     {"dag": {"loss": torch.tensor(1.0), "factor": 1.0}},
                                     {"word_ins": {"out": torch.zeros(2, 3, 5), "tgt": torch.zeros(2, 3, 4)}}])
def test_a_student_without_reference_aligned_word_outputs_is_refused_by_name(outputs):
    from fairseq_plugins.criterions.nat_word_kd import _AlphaWeightedStudent

    class CTCNATModel:
        def __call__(self, *args, **kwargs):
            return outputs

    with pytest.raises(TeacherError, match=r"nat_word_kd: CTCNATModel has no word_ins output aligned with the "
                                           r"reference tokens .* train it with nat_loss"):
        _AlphaWeightedStudent(CTCNATModel(), 0.5)()


def test_teacher_of_another_dictionary_is_refused_by_criterion_and_precompute(micro_teacher, tmp_path, capsys):
    from nat_kd.prepare import PrepareConfig, prepare
    from nat_kd.teacher_topk import main as teacher_topk_main

    other = prepare(PrepareConfig("en", "de", vocab_size=250, train_limit=100), out_dir=tmp_path / "other")
    task, _ = translation_task_and_batch(other / "bin")
    with pytest.raises(TeacherError, match=r"source dictionary of teacher .*checkpoint_last\.pt \(\d+ entries\) "
                                           r"differs from the student's .*--srcdict"):
        kd_criterion(task, teacher_path=str(micro_teacher))
    assert teacher_topk_main([str(other / "bin"), "--teacher-path", str(micro_teacher), "--out", str(tmp_path / "t")]) == 2
    assert "dictionary" in capsys.readouterr().err and not (tmp_path / "t").exists()
    assert teacher_topk_main([str(other / "bin"), "--teacher-path", str(tmp_path / "no.pt"), "--out",
                              str(tmp_path / "t")]) == 2
    assert "no.pt does not exist" in capsys.readouterr().err
