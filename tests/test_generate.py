"""nat_kd.generate_distilled end to end on a micro teacher: strategies, resume, shards, bad input."""
import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch

from conftest import (EMPTY_LINE, LONG_LINE, N_LINES, cli, config, kill_after_first_chunk_and_resume, lines,
                      output_bytes, python_m)
from nat_kd.distill.progress import ChunkStore, ProgressError, plan_chunks, shard_from_env
from nat_kd.distill.decoding import DecodingSettings
from nat_kd.distill import DistillConfig, distill
from nat_kd.generate_distilled import main
from fairseq_plugins.teacher import TeacherError

@pytest.fixture(scope="module")
def runs(teacher, tiny_en_de, corpus, tmp_path_factory):
    """One run per strategy (plus seq-inter by chrF and a second sampling seed)."""
    base = tmp_path_factory.mktemp("runs")
    settings = {"beam": dict(strategy="beam", beam=4), "greedy": dict(strategy="greedy"),
                "sampling": dict(strategy="sampling", seed=1), "sampling_seed2": dict(strategy="sampling", seed=2),
                "topk": dict(strategy="topk", top_k=5), "topp": dict(strategy="topp", top_p=0.8),
                "seq-inter": dict(strategy="seq-inter", beam=4),
                "seq-inter-chrf": dict(strategy="seq-inter", beam=4, seq_inter_metric="chrf")}
    return {name: distill(config(teacher, tiny_en_de, corpus, base / name, **s)).out_dir
            for name, s in settings.items()}


@pytest.mark.parametrize("name", ["beam", "greedy", "sampling", "topk", "topp", "seq-inter"])
@pytest.mark.slow
def test_every_strategy_writes_line_aligned_output(runs, corpus, name):
    from fairseq.data import data_utils, Dictionary

    out = runs[name]
    assert lines(out / "valid.en") == lines(corpus / "src.en")  # the source, copied as is
    assert len(lines(out / "valid.de")) == N_LINES and len(lines(out / "spm" / "valid.de")) == N_LINES
    assert [i + 1 for i, line in enumerate(lines(out / "spm" / "valid.de")) if not line] == [EMPTY_LINE]
    for lang in ("en", "de"):  # the empty source's pair is left out of bin/
        dataset = data_utils.load_indexed_dataset(str(out / "bin" / f"valid.en-de.{lang}"),
                                                  Dictionary.load(str(out / "bin" / f"dict.{lang}.txt")))
        assert len(dataset) == N_LINES - 1
    meta = json.loads((out / "meta.json").read_text())
    assert meta["strategy"] == name and meta["name"] == name and meta["sentences"] == N_LINES
    assert meta["empty_source_lines"] == [EMPTY_LINE] and meta["truncated_source_lines"] == [LONG_LINE]
    assert meta["files"]["binarized_left_out_lines"] == [EMPTY_LINE] and meta["backend"]["name"] == "fairseq"
    assert {"bleu", "chrf", "mean_length_ratio"} <= set(meta["scores"])
    assert meta["timing"]["sentences_per_second"] > 0


@pytest.fixture(scope="module")
def valid_head(tiny_en_de, tmp_path_factory):
    """The first N_LINES valid sentences of the tiny corpus, binarized as fairseq-preprocess does, with the
    corpus's dictionaries: input that fairseq-generate and the generator both read."""
    from fairseq.data import Dictionary
    from nat_kd.distill.output import binarize
    from nat_kd.distill.source import load_binarized

    source = load_binarized(tiny_en_de / "bin", "valid", "en", "en-de",
                            Dictionary.load(str(tiny_en_de / "bin" / "dict.en.txt")))[:N_LINES]
    target = (tiny_en_de / "spm" / "valid.de").read_text(encoding="utf-8").splitlines()[:N_LINES]
    folder = tmp_path_factory.mktemp("valid_head") / "bin"
    binarize(folder, "valid", "en", "de", tiny_en_de / "bin", source, target)
    return folder


# fairseq-generate's settings and the generator's for the same decode: batches of 300 tokens, outputs of at most
# 20 tokens, every batch kept (--required-batch-size-multiple 1)
MAX_TOKENS, MAX_LEN_B = 300, 20


def fairseq_generate(data, path: str, beam: int) -> list[str]:
    """fairseq-generate's best hypothesis (sentencepiece pieces) of every sentence of ``data``'s valid split,
    decoded with ``--path`` (A.pt or A.pt:B.pt, an ensemble) and ``--beam``, in sentence order."""
    from conftest import hypotheses, run_fairseq

    log = run_fairseq("generate", data, "--user-dir", "fairseq_plugins", "--task", "translation", "--gen-subset",
                      "valid", "--path", path, "--beam", beam, "--max-len-a", "0", "--max-len-b", MAX_LEN_B,
                      "--max-tokens", MAX_TOKENS, "--required-batch-size-multiple", "1", "--cpu")
    found = hypotheses(log)
    assert sorted(found) == list(range(len(found)))
    return [found[i] for i in range(len(found))]


def distill_head(teachers, tiny_en_de, data, out, **decoding) -> list[str]:
    """The generator's pieces (spm/valid.de) for ``data``'s valid split, with fairseq_generate's settings."""
    out = distill(DistillConfig(teachers=[str(t) for t in teachers], out_dir=str(out), split="valid",
                                spm_model=str(tiny_en_de / "spm.model"), data_dir=str(data),
                                decoding=DecodingSettings(max_len_b=MAX_LEN_B, **decoding), max_tokens=MAX_TOKENS,
                                workers=1, threads=1, progress_bar=False)).out_dir
    return lines(out / "spm" / "valid.de")


@pytest.mark.slow
def test_greedy_matches_beam_one_and_beam_differs_from_sampling(teacher, tiny_en_de, valid_head, tmp_path):
    """greedy is beam search with beam 1: the generator's greedy and its beam 1 agree line for line, and both are
    fairseq-generate --beam 1's; beam 5 is fairseq-generate --beam 5's and, on some line, not greedy's; sampling
    is neither."""
    greedy = distill_head([teacher], tiny_en_de, valid_head, tmp_path / "greedy", strategy="greedy")
    beam_one = distill_head([teacher], tiny_en_de, valid_head, tmp_path / "beam1", strategy="beam", beam=1)
    beam_five = distill_head([teacher], tiny_en_de, valid_head, tmp_path / "beam5", strategy="beam", beam=5)
    sampled = distill_head([teacher], tiny_en_de, valid_head, tmp_path / "sampling", strategy="sampling", seed=1)
    assert len(greedy) == N_LINES
    assert greedy == beam_one
    assert greedy == fairseq_generate(valid_head, teacher, 1)
    assert beam_five == fairseq_generate(valid_head, teacher, 5)
    assert beam_five != greedy  # the beam's width changes some line: the comparisons above can tell 1 from 5
    assert sampled != greedy and sampled != beam_five


def sentence_scores(metric, hyps, refs):
    return [metric.sentence_score(h, [r]).score for h, r in zip(hyps, refs)]


@pytest.mark.parametrize("run, metric", [("seq-inter", sacrebleu.BLEU(effective_order=True)),
                                         ("seq-inter-chrf", sacrebleu.CHRF())])
def test_seq_inter_is_never_worse_than_beam_per_sentence(runs, corpus, run, metric):
    refs = lines(corpus / "ref.de")
    beam = sentence_scores(metric, lines(runs["beam"] / "valid.de"), refs)
    inter = sentence_scores(metric, lines(runs[run] / "valid.de"), refs)
    assert all(i >= b - 1e-9 for i, b in zip(inter, beam))  # beam's best is among the K candidates
    assert sum(inter) > sum(beam)


def test_sampling_is_diverse_and_reproducible_under_another_batch_size(runs, teacher, tiny_en_de, corpus, tmp_path):
    one, two = lines(runs["sampling"] / "valid.de"), lines(runs["sampling_seed2"] / "valid.de")
    assert sum(a != b for a, b in zip(one, two)) > N_LINES // 2  # another seed, other samples
    assert len(set(one)) > N_LINES // 2
    again = distill(config(teacher, tiny_en_de, corpus, tmp_path / "s", strategy="sampling", seed=1,
                           max_tokens=1100, max_sentences=12, chunk_sentences=12)).out_dir
    meta_small, meta_big = (json.loads((d / "meta.json").read_text()) for d in (again, runs["sampling"]))
    assert meta_small["batching"]["chunks"] > meta_big["batching"]["chunks"]  # really other batches
    assert (again / "valid.de").read_bytes() == (runs["sampling"] / "valid.de").read_bytes()


def test_rerun_of_a_finished_run_is_a_no_op(runs, teacher, tiny_en_de, corpus):
    out = runs["greedy"]
    before = (out / "meta.json").read_bytes()
    distill(config(teacher, tiny_en_de, corpus, out, strategy="greedy"))
    assert (out / "meta.json").read_bytes() == before


@pytest.mark.slow
def test_killed_run_resumes_to_identical_output(teacher, tiny_en_de, corpus, tmp_path):
    reference = distill(config(teacher, tiny_en_de, corpus, tmp_path / "whole", strategy="topk",
                               max_tokens=1100, max_sentences=6, chunk_sentences=6)).out_dir
    out = tmp_path / "killed"
    command = cli(teacher, tiny_en_de, corpus, out, "--strategy", "topk", "--max-tokens", "1100",
                  "--max-sentences", "6", "--chunk-sentences", "6")
    kill_after_first_chunk_and_resume(command, out)
    assert output_bytes(out) == output_bytes(reference)


@pytest.mark.slow
def test_two_shards_then_merge_equal_one_run(runs, teacher, tiny_en_de, corpus, tmp_path):
    out = tmp_path / "sharded"
    # batches of 8 sentences, one per chunk: 6 chunks, shard 1 gets 3, decoded by 2 worker processes
    kw = dict(strategy="beam", beam=4, max_sentences=8, chunk_sentences=8)
    first = distill(config(teacher, tiny_en_de, corpus, out, num_shards=2, shard_id=0, **kw))
    assert not first.complete and not out.exists()
    with pytest.raises(ProgressError, match=r"shard ids \[1\] of 2"):
        distill(config(teacher, tiny_en_de, corpus, out, num_shards=2, merge_only=True, **kw))
    second = distill(config(teacher, tiny_en_de, corpus, out, num_shards=2, shard_id=1, workers=2, **kw))
    assert second.complete and second.meta["batching"]["chunks"] >= 6
    whole = distill(config(teacher, tiny_en_de, corpus, tmp_path / "whole", **kw)).out_dir
    assert output_bytes(out) == output_bytes(whole)
    # and the same hypotheses as the default chunking of the strategy run
    assert (out / "valid.de").read_bytes() == (runs["beam"] / "valid.de").read_bytes()


def test_shards_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert shard_from_env(None, None) == (4, 3)
    assert shard_from_env(2, 1) == (2, 1)  # explicit flags win
    monkeypatch.delenv("WORLD_SIZE")
    assert shard_from_env(None, None) == (1, 0)
    with pytest.raises(ProgressError):
        shard_from_env(2, 2)


def test_workers_share_a_gpu_only_when_asked_and_each_loads_the_teacher_on_it(monkeypatch):
    from nat_kd.distill import pool
    from nat_kd.distill.backends.fairseq import FairseqBackend

    def cfg(**kw):
        return DistillConfig(teachers=["teacher.pt"], out_dir="out", **kw)

    monkeypatch.setattr(pool, "available_cores", lambda: 16)
    assert pool.parallelism(cfg(), "cuda:0") == (1, 1)
    assert pool.parallelism(cfg(workers=3), "cuda:1") == (3, 1)
    assert pool.parallelism(cfg(), "cpu") == (16, 1)
    assert pool.parallelism(cfg(workers=4), "cpu") == (4, 4)
    assert pool.parallelism(cfg(backend="ctranslate2"), "cpu") == (1, 16)  # its policy: one process of replicas
    loaded = []

    class LoadedRun:
        def __init__(self, cfg, device="cpu"):
            loaded.append(device)

    monkeypatch.setattr(pool, "LoadedRun", LoadedRun)
    monkeypatch.setattr(pool, "ChunkDecoder", lambda loaded, threads: "decoder")
    monkeypatch.setattr(pool, "reuse_freed_memory", lambda: None)
    threads = torch.get_num_threads()
    try:
        pool._worker_init(cfg(), FairseqBackend, 1, "cuda:1", 3)
    finally:
        torch.set_num_threads(threads)
        pool._WORKER.clear()
    assert loaded == ["cuda:1"]


OUT_OF_MEMORY = ("out of GPU memory on {device}, decoding batches of up to --max-tokens {tokens} tokens in {workers} "
                 "process(es) on it; the chunks saved so far are kept. Rerun with fewer --workers to go on from them, "
                 "or start again in smaller batches: a smaller --max-tokens and another --out")


def test_out_of_gpu_memory_is_one_line_naming_what_to_lower_and_the_saved_chunks_are_kept(
        teacher, tiny_en_de, corpus, tmp_path, monkeypatch, capsys):
    from nat_kd.artifacts import DistilledSet
    from nat_kd.distill.backends.fairseq import FairseqBackend

    decode, calls = FairseqBackend.decode, []

    def third_batch_runs_out(self, ids):
        calls.append(ids)
        if len(calls) == 3:  # chunk 0 is saved once chunk 1 is decoded; chunk 2 then runs out
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (a test)")
        return decode(self, ids)

    monkeypatch.setattr(FairseqBackend, "decode", third_batch_runs_out)
    out = tmp_path / "o"
    argv = cli(teacher, tiny_en_de, corpus, out, "--max-sentences", "8", "--chunk-sentences", "8")[3:]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: " + OUT_OF_MEMORY.format(device="cpu", tokens=12000,
                                                                                       workers=1)
    saved = ChunkStore(DistilledSet(out).progress_dir)
    assert saved.is_done(0) and not saved.is_done(1) and not saved.is_done(2)
    monkeypatch.setattr(FairseqBackend, "decode", decode)
    assert main(argv) == 0 and DistilledSet(out).meta()["sentences"] == N_LINES


@pytest.mark.parametrize("raised", [torch.cuda.OutOfMemoryError("CUDA out of memory (a test)"),
                                    RuntimeError("CUDA failed with error out of memory")])  # CTranslate2's
def test_a_worker_process_out_of_gpu_memory_sends_the_line_back_and_other_errors_as_they_are(raised, monkeypatch):
    import pickle

    from nat_kd.distill import pool

    class Decoder:
        def decode_chunk(self, batches):
            raise error

    settings = (DistillConfig(teachers=["teacher.pt"], out_dir="out", max_tokens=32000), "cuda:0", 4)
    monkeypatch.setitem(pool._WORKER, "decoder", Decoder())
    monkeypatch.setitem(pool._WORKER, "settings", settings)
    error = raised
    with pytest.raises(pool.OutOfGPUMemory) as caught:
        pool._worker_decode((3, [[1, 2]]))
    back = pickle.loads(pickle.dumps(caught.value))  # as the pool hands it to the parent
    assert str(back) == OUT_OF_MEMORY.format(device="cuda:0", tokens=32000, workers=4)
    error = RuntimeError("CUDA failed with error an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        pool._worker_decode((3, [[1, 2]]))


def test_chunk_plan_and_changed_settings_refused(tmp_path):
    assert plan_chunks([[1, 2], [3], [4, 5, 6], [7]], 3) == [[[1, 2], [3]], [[4, 5, 6]], [[7]]]
    store = ChunkStore(tmp_path / "p")
    store.open_plan({"beam": 5}, [[[0]]])
    with pytest.raises(ProgressError, match="changed: beam"):
        store.open_plan({"beam": 4}, [[[0]]])


def run_main(capsys, *argv):
    code = main(list(map(str, argv)))
    return code, capsys.readouterr().err


def test_bad_input_is_a_clear_error(teacher, tiny_en_de, corpus, tmp_path, capsys):
    common = ["--spm-model", tiny_en_de / "spm.model", "--dict-dir", tiny_en_de / "bin", "--split", "valid",
              "--workers", "1", "--no-progress-bar", "--out", tmp_path / "o"]
    code, err = run_main(capsys, "--teacher", tmp_path / "nope.pt", "--source", corpus / "src.en", *common)
    assert code == 2 and "nope.pt does not exist" in err
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    code, err = run_main(capsys, "--teacher", broken, "--source", corpus / "src.en", *common)
    assert code == 2 and "cannot load teacher checkpoint" in err and "broken.pt" in err
    short_ref = tmp_path / "short.de"
    short_ref.write_text("one line\n")
    code, err = run_main(capsys, "--teacher", teacher, "--source", corpus / "src.en", "--reference", short_ref,
                         *common)
    assert code == 2 and "line-count mismatch" in err and "short.de has 1 lines" in err
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"fine\nbad \xff byte\n")
    code, err = run_main(capsys, "--teacher", teacher, "--source", bad, *common)
    assert code == 2 and "bad.en:2: invalid UTF-8" in err
    code, err = run_main(capsys, "--teacher", teacher, "--source", corpus / "src.en", "--strategy", "seq-inter",
                         *common)
    assert code == 2 and "--reference" in err
    assert not (tmp_path / "o").exists()
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "precious.txt").write_text("keep me")
    code, err = run_main(capsys, "--teacher", teacher, "--source", corpus / "src.en", *common)
    assert code == 2 and "not a distilled set" in err and (tmp_path / "o" / "precious.txt").exists()


def test_dictionary_that_does_not_match_is_an_error(teacher, tiny_en_de, tmp_path, capsys):
    # same size, two entries swapped: binarized data with another dictionary
    swapped = tmp_path / "swapped"
    shutil.copytree(tiny_en_de / "bin", swapped)
    entries = (swapped / "dict.en.txt").read_text(encoding="utf-8").splitlines()
    entries[0], entries[1] = entries[1], entries[0]
    (swapped / "dict.en.txt").write_text("".join(e + "\n" for e in entries), encoding="utf-8")
    with pytest.raises(TeacherError, match=r"dictionary of teacher .* differs from the data's"):
        distill(DistillConfig(teachers=[str(teacher)], out_dir=str(tmp_path / "o"), split="valid",
                              spm_model=str(tiny_en_de / "spm.model"), data_dir=str(swapped),
                              dict_dir=str(tiny_en_de / "bin"), workers=1, progress_bar=False))
    # another size: the teacher's embeddings do not fit
    smaller = tmp_path / "smaller"
    shutil.copytree(tiny_en_de / "bin", smaller)
    for lang in ("en", "de"):
        kept = (smaller / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines()[:-10]
        (smaller / f"dict.{lang}.txt").write_text("".join(e + "\n" for e in kept), encoding="utf-8")
    code, err = run_main(capsys, "--teacher", teacher, "--data", smaller, "--dict-dir", smaller, "--split", "valid",
                         "--spm-model", tiny_en_de / "spm.model", "--out", tmp_path / "o2", "--workers", "1")
    assert code == 2 and "embeddings" in err and "dict.en.txt" in err


def test_binarized_input_gives_the_same_hypotheses_as_raw_text(runs, teacher, tiny_en_de, tmp_path):
    """--data (fairseq-binarized) and --source (raw text) decode the same sentences to the same output."""
    from fairseq.data import Dictionary
    from nat_kd.distill.output import binarize
    from nat_kd.distill.source import load_binarized

    # the first valid sentences, binarized as fairseq-preprocess does (tests/test_distill_output.py)
    source = load_binarized(tiny_en_de / "bin", "valid", "en", "en-de",
                            Dictionary.load(str(tiny_en_de / "bin" / "dict.en.txt")))[:N_LINES]
    target = (tiny_en_de / "spm" / "valid.de").read_text(encoding="utf-8").splitlines()[:N_LINES]
    binarize(tmp_path / "bin", "valid", "en", "de", tiny_en_de / "bin", source, target)
    for file in (tiny_en_de / "bin").glob("test.en-de.*"):  # another split, to be copied beside the distilled one
        shutil.copyfile(file, tmp_path / "bin" / file.name)
    out = distill(DistillConfig(teachers=[str(teacher)], out_dir=str(tmp_path / "b"), split="valid",
                                spm_model=str(tiny_en_de / "spm.model"), data_dir=str(tmp_path / "bin"),
                                decoding=DecodingSettings(strategy="greedy", max_len_b=20), workers=1,
                                threads=1, progress_bar=False)).out_dir
    raw, binarized = lines(runs["greedy"] / "valid.de"), lines(out / "valid.de")
    assert len(binarized) == N_LINES
    same = [i for i in range(N_LINES) if i + 1 not in (EMPTY_LINE, LONG_LINE)]  # those two were altered
    assert [raw[i] for i in same] == [binarized[i] for i in same]
    # without --source, the source copy is the detokenized binarized source
    original = (tiny_en_de / "raw" / "valid.en").read_text(encoding="utf-8").splitlines()[:N_LINES]
    assert lines(out / "valid.en") == original
    meta = json.loads((out / "meta.json").read_text())
    assert meta["files"]["original_splits_in_bin"] == ["test"]
    assert (out / "bin" / "test.en-de.de.bin").read_bytes() == (tiny_en_de / "bin" / "test.en-de.de.bin").read_bytes()


def test_ensemble_of_two_checkpoints(runs, teacher, tiny_en_de, corpus, tmp_path):
    """The same teacher twice: fairseq averages two equal distributions, so greedy output stays the same
    (up to float rounding in the averaging, hence the tolerance of a few lines)."""
    cfg = config(teacher, tiny_en_de, corpus, tmp_path / "e", strategy="greedy")
    cfg.teachers = [str(teacher), str(teacher)]
    meta = distill(cfg).meta
    assert len(meta["teacher"]["checkpoints"]) == 2 and meta["sentences"] == N_LINES
    ensemble, single = lines(tmp_path / "e" / "valid.de"), lines(runs["greedy"] / "valid.de")
    assert sum(a == b for a, b in zip(ensemble, single)) >= N_LINES - 3


@pytest.mark.slow
def test_ensemble_of_two_different_checkpoints_is_fairseq_generates(teacher, other_teacher, tiny_en_de, valid_head,
                                                                    tmp_path):
    """--teacher-path A.pt:B.pt of two different models (other seed, other number of updates), beam 5: token for
    token what fairseq-generate --path A.pt:B.pt prints, every line; and on some line neither A's nor B's own
    output, so the comparison can tell an ensemble from either model alone."""
    ensemble_path = f"{teacher}:{other_teacher}"
    out = tmp_path / "ensemble"
    python_m("nat_kd.generate_distilled", "--teacher-path", ensemble_path, "--teacher-data", tiny_en_de / "bin",
             "--data", valid_head, "--split", "valid", "--spm-model", tiny_en_de / "spm.model", "--strategy", "beam",
             "--beam", "5", "--max-len-b", MAX_LEN_B, "--max-tokens", MAX_TOKENS, "--workers", "1", "--threads", "1",
             "--no-progress-bar", "--out", out)
    meta = json.loads((out / "meta.json").read_text())
    assert len(meta["teacher"]["checkpoints"]) == 2
    ensemble = lines(out / "spm" / "valid.de")
    assert len(ensemble) == N_LINES
    assert ensemble == fairseq_generate(valid_head, ensemble_path, 5)
    for alone in (teacher, other_teacher):
        single = distill_head([alone], tiny_en_de, valid_head, tmp_path / alone.parent.name, strategy="beam", beam=5)
        assert single != ensemble, alone


@pytest.mark.slow
def test_output_projection_runs_as_one_matrix_product_per_step(teacher, tiny_en_de, corpus, tmp_path):
    """A frozen teacher makes torch's matmul run the vocabulary projection of fairseq's strided last-step
    features as one matrix-vector product per hypothesis (aten::bmm over the vocabulary): measured 1.6x
    slower beam search on the CPU. The generator must keep fairseq-generate's single GEMM per step."""
    from torch.profiler import profile

    from nat_kd.distill.chunk_decoder import ChunkDecoder
    from nat_kd.distill.loaded import LoadedRun

    loaded = LoadedRun(config(teacher, tiny_en_de, corpus, tmp_path / "out", strategy="beam", beam=4))
    vocab = len(loaded.teacher.tgt_dict)
    decoder = ChunkDecoder(loaded)
    with profile(record_shapes=True) as prof:
        decoder.decode_batch(loaded.batches()[0])
    calls = [(event.key, event.input_shapes) for event in prof.key_averages(group_by_input_shape=True)]
    vocab_products = [(name, shapes) for name, shapes in calls
                      if name in ("aten::bmm", "aten::mm", "aten::addmm") and vocab in sum(shapes, [])]
    assert vocab_products, calls  # the projection was seen at all
    assert all(name != "aten::bmm" for name, _ in vocab_products), vocab_products


def fairseq_generate_batches(task, split: str, max_tokens: int) -> list[list[int]]:
    """The batches fairseq-generate decodes a binarized split in (fairseq_cli/generate.py's iterator)."""
    task.load_dataset(split)
    iterator = task.get_batch_iterator(
        dataset=task.dataset(split), max_tokens=max_tokens, max_positions=None, ignore_invalid_inputs=False,
        required_batch_size_multiple=1, seed=1, num_shards=1, shard_id=0, num_workers=0,
        disable_iterator_cache=True)
    return [list(map(int, batch)) for batch in iterator.frozen_batches]


@pytest.mark.parametrize("split", ["valid", "test"])  # fairseq shuffles ties in every split but "test"
def test_batches_are_fairseq_generates_from_binarized_or_raw_input(teacher, tiny_en_de, tmp_path, split):
    """A hypothesis depends, in its last float bits, on the batch it is decoded in: only fairseq-generate's
    own batches (sorted by source, then reference length; max of the two counted) reproduce its output."""
    from nat_kd.distill.loaded import LoadedRun

    common = dict(teachers=[str(teacher)], spm_model=str(tiny_en_de / "spm.model"), split=split,
                  dict_dir=str(tiny_en_de / "bin"), max_tokens=300, workers=1, threads=1, progress_bar=False)
    binarized = LoadedRun(DistillConfig(out_dir=str(tmp_path / "b"), data_dir=str(tiny_en_de / "bin"), **common))
    raw = LoadedRun(DistillConfig(out_dir=str(tmp_path / "r"), source=str(tiny_en_de / "raw" / f"{split}.en"),
                                 reference=str(tiny_en_de / "raw" / f"{split}.de"), **common))
    expected = fairseq_generate_batches(binarized.teacher.task, split, 300)
    assert len(expected) > 20
    assert binarized.batches() == expected
    assert raw.batches() == expected


@pytest.mark.slow
def test_hypotheses_are_fairseq_generates(teacher, tiny_en_de, tmp_path):
    """Beam search over the whole valid split: token for token what fairseq-generate prints, every line."""
    from conftest import run_fairseq

    log = run_fairseq("generate", tiny_en_de / "bin", "--user-dir", "fairseq_plugins", "--task", "translation",
                      "--gen-subset", "valid", "--path", teacher, "--beam", "4", "--max-len-a", "0",
                      "--max-len-b", "20", "--max-tokens", "300", "--required-batch-size-multiple", "1")
    theirs = {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t[^\t]*\t(.*)$", log, re.M)}
    out = distill(DistillConfig(teachers=[str(teacher)], out_dir=str(tmp_path / "o"), split="valid",
                                spm_model=str(tiny_en_de / "spm.model"), data_dir=str(tiny_en_de / "bin"),
                                decoding=DecodingSettings(strategy="beam", beam=4, max_len_b=20), max_tokens=300,
                                workers=1, threads=1, progress_bar=False)).out_dir
    ours = lines(out / "spm" / "valid.de")
    assert len(ours) == len(theirs) == 1014
    assert [i for i in range(len(ours)) if ours[i] != theirs[i]] == []


@pytest.mark.parametrize("strategy, extra", [("beam", {"beam": 4}), ("greedy", {}), ("topk", {"temperature": 0.7}),
                                             ("ensemble", {"beam": 3})])
@pytest.mark.slow
def test_lean_ensemble_decodes_exactly_as_fairseqs(teacher, tiny_en_de, corpus, tmp_path, strategy, extra):
    """Tokens, scores and positional scores of every n-best hypothesis equal those of fairseq's EnsembleModel."""
    from fairseq.sequence_generator import EnsembleModel

    from nat_kd.distill.chunk_decoder import ChunkDecoder
    from nat_kd.distill.decoding.ensemble import LeanEnsembleModel
    from nat_kd.distill.loaded import LoadedRun

    cfg = config(teacher, tiny_en_de, corpus, tmp_path / "o", strategy="beam" if strategy == "ensemble" else strategy,
                 max_tokens=1100, max_sentences=8, **extra)
    if strategy == "ensemble":
        cfg.teachers = [str(teacher), str(teacher)]
    loaded = LoadedRun(cfg)
    generator = ChunkDecoder(loaded).backend.generator
    assert isinstance(generator.model, LeanEnsembleModel)
    results = {}
    for name, model in (("lean", generator.model), ("fairseq", EnsembleModel(list(loaded.teacher.models)))):
        generator.model = model
        results[name] = [loaded.teacher.task.inference_step(generator, loaded.teacher.models,
                                                             loaded.dataset.collater([loaded.dataset[i] for i in b]))
                         for b in loaded.batches()]
    assert len(results["lean"]) > 3
    for lean_batch, plain_batch in zip(results["lean"], results["fairseq"]):
        for lean, plain in zip(lean_batch, plain_batch):
            assert len(lean) == len(plain)
            for a, b in zip(lean, plain):
                assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["score"], b["score"])
                assert torch.equal(a["positional_scores"], b["positional_scores"])


def test_lean_ensemble_skips_only_reorders_within_a_sentence(teacher, tiny_en_de, corpus, tmp_path):
    from nat_kd.distill.decoding.ensemble import LeanEnsembleModel
    from nat_kd.distill.loaded import LoadedRun

    loaded = LoadedRun(config(teacher, tiny_en_de, corpus, tmp_path / "o", strategy="beam", beam=2))
    model = LeanEnsembleModel(list(loaded.teacher.models))
    model.set_decoder_beam_size(2)
    sample = loaded.dataset.collater([loaded.dataset[i] for i in (0, 1)])
    encoded = model.forward_encoder(sample["net_input"])  # 2 sentences
    expanded = model.reorder_encoder_out(encoded, torch.tensor([0, 0, 1, 1]))  # rows 2 -> 4: copied
    assert expanded is not encoded and expanded[0]["encoder_out"][0].size(1) == 4
    swapped = model.reorder_encoder_out(expanded, torch.tensor([1, 0, 3, 2]))  # beams swap inside each sentence
    assert swapped is expanded
    crossed = model.reorder_encoder_out(swapped, torch.tensor([2, 1, 0, 3]))  # row 0 takes sentence 1's row
    assert crossed is not swapped
    assert torch.equal(crossed[0]["encoder_out"][0][:, 0], expanded[0]["encoder_out"][0][:, 2])
    shrunk = model.reorder_encoder_out(crossed, torch.tensor([2, 3]))  # sentence 0 finished
    assert shrunk is not crossed and shrunk[0]["encoder_out"][0].size(1) == 2


def fairseq_backends(teacher, tiny_en_de, corpus, tmp_path):
    """A loaded (seq-inter: n-best lists of 4), its non-empty batches, and fairseq backends decoding in the
    calling thread and in a background one (forced: on the CPU the default is the calling thread)."""
    from nat_kd.distill.backends.fairseq import FairseqBackend
    from nat_kd.distill.loaded import LoadedRun

    loaded = LoadedRun(config(teacher, tiny_en_de, corpus, tmp_path / "o", strategy="seq-inter", beam=4,
                             max_tokens=1100, max_sentences=6))
    empty = {line - 1 for line in loaded.corpus.empty_lines}
    batches = [[i for i in batch if i not in empty] for batch in loaded.batches()]
    synchronous = FairseqBackend(loaded.backend_settings, loaded.backend_inputs)
    background = FairseqBackend(loaded.backend_settings, loaded.backend_inputs, background=True)
    assert not synchronous.background and background.background
    return loaded, [b for b in batches if b], synchronous, background


def decoding_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("nat-kd-fairseq")]


def test_fairseq_backend_decodes_in_a_background_thread_exactly_as_in_the_callers(teacher, tiny_en_de, corpus,
                                                                                  tmp_path):
    """Every batch queued before any result is read: one thread decodes them in order, each hypothesis (pieces
    and log-probability, whole n-best lists) the calling thread's; close() leaves no thread behind."""
    from concurrent.futures import Future

    loaded, batches, synchronous, background = fairseq_backends(teacher, tiny_en_de, corpus, tmp_path)
    assert len(batches) > 5
    try:
        queued = [background.submit(batch) for batch in batches]
        assert all(isinstance(future, Future) for future in queued) and len(decoding_threads()) == 1
        expected = [synchronous.decode(batch) for batch in batches]
        assert [future.result(timeout=120) for future in queued] == expected
    finally:
        background.close()
    assert decoding_threads() == []
    assert all(len(nbest) == 4 for batch in expected for _, nbest in batch)
    assert [sorted(i for i, _ in batch) for batch in expected] == [sorted(batch) for batch in batches]


def test_fairseq_backend_submit_returns_before_the_batch_is_decoded(teacher, tiny_en_de, corpus, tmp_path,
                                                                    monkeypatch):
    loaded, batches, synchronous, background = fairseq_backends(teacher, tiny_en_de, corpus, tmp_path)
    caller, release = threading.get_ident(), threading.Event()
    started = [threading.Event(), threading.Event()]  # the first batch's decoding has begun, the second's
    decode = background.decode

    def held(ids):
        if threading.get_ident() == caller:
            raise AssertionError("decoded in the calling thread")
        started[ids != batches[0]].set()
        if not release.wait(60):
            raise AssertionError("never released")
        return decode(ids)

    monkeypatch.setattr(background, "decode", held)
    try:
        first, second = background.submit(batches[0]), background.submit(batches[1])
        assert started[0].wait(60)  # the thread has taken the first batch and waits
        assert not first.done() and not second.done()
        assert not started[1].wait(0.2)  # the second waits for the first: one thread, batches in order
        release.set()
        assert first.result(timeout=60) == synchronous.decode(batches[0])
        assert second.result(timeout=60) == synchronous.decode(batches[1])
    finally:
        release.set()
        background.close()


def test_fairseq_backend_error_in_the_background_thread_surfaces_from_result(teacher, tiny_en_de, corpus, tmp_path,
                                                                            monkeypatch):
    """The decoding's own error, as the calling thread would raise it, from result() and from finish_chunk."""
    from nat_kd.distill.chunk_decoder import ChunkDecoder

    loaded, batches, synchronous, background = fairseq_backends(teacher, tiny_en_de, corpus, tmp_path)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test)")

    for backend in (synchronous, background):
        monkeypatch.setattr(backend.generator, "generate", out_of_memory)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="a test"):
        synchronous.submit(batches[0])
    try:
        future = background.submit(batches[0])
        with pytest.raises(torch.cuda.OutOfMemoryError, match="a test"):
            future.result(timeout=60)
        decoder = ChunkDecoder(loaded, backend=background)
        pending = decoder.submit_chunk(batches[:2])
        with pytest.raises(torch.cuda.OutOfMemoryError, match="a test"):
            decoder.finish_chunk(pending)
    finally:
        background.close()


@pytest.mark.slow
def test_run_with_fairseq_decoding_in_the_background_writes_the_same_set(teacher, tiny_en_de, corpus, tmp_path,
                                                                         monkeypatch):
    """The single-process loop with the fairseq backend's background thread (a GPU's default, forced here):
    the same files, the thread stopped at the end, and the chunks' seconds within the decoding's wall time."""
    from nat_kd.distill import chunk_decoder
    from nat_kd.distill.backends.fairseq import FairseqBackend

    kw = dict(strategy="beam", beam=2, max_tokens=1100, max_sentences=6, chunk_sentences=6)
    reference = distill(config(teacher, tiny_en_de, corpus, tmp_path / "calling", **kw)).out_dir
    built = []

    def background_backend(settings, inputs, threads=1):
        built.append(FairseqBackend(settings, inputs, threads, background=True))
        return built[-1]

    monkeypatch.setattr(chunk_decoder, "build_backend", background_backend)
    result = distill(config(teacher, tiny_en_de, corpus, tmp_path / "background", **kw))
    assert len(built) == 1 and decoding_threads() == []
    assert output_bytes(result.out_dir) == output_bytes(reference)
    timing = result.meta["timing"]
    assert 0 < timing["chunk_decode_seconds_total"] <= timing["decode_wall_seconds"] + 0.01


def test_distilled_set_names_every_file_the_generator_writes(runs):
    from nat_kd.artifacts import DistilledSet

    out = DistilledSet(runs["beam"])
    meta = out.meta()
    assert meta["strategy"] == "beam" and not out.progress_dir.exists()
    assert meta["files"]["source"] == out.text("valid", "en").name and meta["files"]["target"] == out.text("valid", "de").name
    named = {out.meta_file, out.scores_file, out.card_markdown, out.card_json, out.card_figure}
    for lang in ("en", "de"):
        named |= {out.text("valid", lang), out.pieces("valid", lang), out.bin.dictionary(lang),
                  *(Path(f"{out.bin.prefix('valid', 'en', 'de', lang)}{ext}") for ext in (".bin", ".idx"))}
    assert {p for p in out.root.rglob("*") if p.is_file()} == named


def test_scores_tsv_holds_each_lines_scores_and_the_teachers_log_probability(runs, teacher, tiny_en_de, corpus):
    """scores.tsv, written while decoding: sacrebleu's sentence scores, and the mean log-probability that the
    teacher, forced through the kept output one sentence at a time, gives its tokens and EOS."""
    from fairseq.data import data_utils
    from fairseq_plugins.teacher import TeacherEnsemble
    from nat_kd.analysis.metrics.sentence import SentenceScores

    out = runs["beam"]
    scores = SentenceScores.read(out / "scores.tsv")
    hyps, refs = lines(out / "valid.de"), lines(corpus / "ref.de")
    assert len(scores) == N_LINES
    assert scores["bleu"] == pytest.approx([sacrebleu.sentence_bleu(h, [r]).score for h, r in zip(hyps, refs)],
                                           abs=1e-4)
    teacher_model = TeacherEnsemble.load([str(teacher)], str(tiny_en_de / "bin"))
    src_dict, tgt_dict = teacher_model.src_dict, teacher_model.tgt_dict
    sources = data_utils.load_indexed_dataset(str(out / "bin" / "valid.en-de.en"), src_dict)
    targets = data_utils.load_indexed_dataset(str(out / "bin" / "valid.en-de.de"), tgt_dict)
    binarized = [i for i in range(N_LINES) if i + 1 != EMPTY_LINE]  # bin/ leaves the empty source's pair out
    for i in (0, 1, EMPTY_LINE, LONG_LINE - 1, N_LINES - 1):
        row = binarized.index(i)
        src, tgt = sources[row].long()[None], targets[row].long()[None]  # tgt ends with EOS
        prev = torch.cat([tgt.new_tensor([[tgt_dict.eos()]]), tgt[:, :-1]], dim=1)
        lprobs = teacher_model.log_probs(src, torch.tensor([src.size(1)]), prev)
        expected = lprobs[0].gather(1, tgt[0][:, None]).mean().item()
        assert scores["logprob"][i] == pytest.approx(expected, abs=1e-4), i
    assert np.isnan(scores["logprob"][EMPTY_LINE - 1])  # an empty source is not decoded
    card = json.loads((out / "card.json").read_text())
    assert card["decoding"]["backend"] == {"name": "fairseq", "fp16": False}
    assert "Backend `fairseq` (fp16=False), strategy `beam`" in (out / "CARD.md").read_text()
    assert card["lines"]["sentences"] == N_LINES and card["lines"]["empty_source_lines"]["first"] == [EMPTY_LINE]
    assert card["teacher"]["parameters"] == sum(p.numel() for p in teacher_model.models[0].parameters())
    assert card["analysis"] is None and "not measured yet" in (out / "CARD.md").read_text()
    assert card["repeated"]["lines"] == int(scores["repeated"].sum())
    assert len(card["examples"]["lines"]) == 10


def test_report_adds_frs_and_the_data_measures_to_the_card(runs, corpus, tmp_path):
    from nat_kd.analysis.metrics.sentence import SentenceScores
    from nat_kd.analyze import main as analyze

    out = tmp_path / "beam"
    shutil.copytree(runs["beam"], out)
    assert analyze(["report", "--real-src", str(corpus / "src.en"), "--real-tgt", str(corpus / "ref.de"),
                    "--split", "valid", "--set-dir", str(out), "--drop-empty", "--out", str(tmp_path / "r")]) == 0
    assert analyze(["reordering", "--src", str(out / "valid.en"), "--tgt", str(out / "valid.de"), "--drop-empty",
                    "--per-sentence", str(tmp_path / "frs.txt")]) == 0
    frs = SentenceScores.read(out / "scores.tsv")["frs"]
    expected = [float(x) for x in (tmp_path / "frs.txt").read_text().split()]
    # the empty source line is dropped from the alignment: NaN in scores.tsv, absent from --per-sentence
    assert np.isnan(frs[EMPTY_LINE - 1])
    assert np.delete(frs, EMPTY_LINE - 1) == pytest.approx(expected, abs=1e-5, nan_ok=True)
    card = json.loads((out / "card.json").read_text())
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert card["analysis"]["complexity"] == report["rows"][1]["complexity"]
    assert card["analysis"]["frequency_buckets"] == report["rows"][1]["frequency_buckets"]
    assert card["analysis"]["signatures"]["complexity"].startswith("complexity|tok:13a|lc:yes|aligner:builtin(")
    assert "### Source words by frequency" in (out / "CARD.md").read_text()


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The student's nat_kd.prepare folder: the same Multi30k slice with its own sentencepiece model of 200
    pieces (the teacher's has 300)."""
    from nat_kd.prepare import PrepareConfig, prepare

    return prepare(PrepareConfig("en", "de", vocab_size=200, train_limit=203),
                   out_dir=tmp_path_factory.mktemp("student") / "en-de")


@pytest.fixture(scope="module")
def student_set(teacher, tiny_en_de, corpus, student, tmp_path_factory):
    """A greedy set with --student-data."""
    return distill(config(teacher, tiny_en_de, corpus, tmp_path_factory.mktemp("s") / "o", strategy="greedy",
                          student_data=str(student)))


def student_encoded(student: Path, lang: str, texts: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """``texts`` as the student's sentencepiece model encodes them, and those pieces as its dictionary stores them
    (a piece it lacks as <unk>)."""
    import sentencepiece
    from fairseq.data import Dictionary

    model = sentencepiece.SentencePieceProcessor(model_file=str(student / "spm.model"))
    dictionary = Dictionary.load(str(student / "bin" / f"dict.{lang}.txt"))
    pieces = [model.encode(text, out_type=str) for text in texts]
    return pieces, [[p if p in dictionary.indices else "<unk>" for p in line] for line in pieces]


def binarized(folder: Path, lang: str, dict_dir: Path) -> list[list[str]]:
    from fairseq.data import Dictionary

    from nat_kd.distill.source import load_binarized

    dictionary = Dictionary.load(str(dict_dir / f"dict.{lang}.txt"))
    return [dictionary.string(t).split() for t in load_binarized(folder, "valid", lang, "en-de", dictionary)]


@pytest.mark.slow
def test_student_data_binarizes_a_fairseq_teachers_set_in_another_vocabulary(teacher, tiny_en_de, corpus, student,
                                                                             student_set, tmp_path_factory):
    """--student-data with a fairseq teacher: bin/ holds the texts encoded by the student's sentencepiece model
    (200 pieces, not the teacher's 300) and its dictionaries, <unk> counted as fairseq-preprocess counts it;
    spm/ keeps the teacher's pieces."""
    out = student_set.out_dir
    kept = [i for i in range(N_LINES) if i + 1 != EMPTY_LINE]  # bin/ leaves the empty source out
    recorded = student_set.meta["student_vocabulary"]
    for lang, side in (("en", "source"), ("de", "target")):
        expected, stored = student_encoded(student, lang, [lines(out / f"valid.{lang}")[i] for i in kept])
        assert binarized(out / "bin", lang, student / "bin") == stored
        assert recorded[side] == {"tokens": sum(map(len, expected)),
                                  "unk": sum(line.count("<unk>") for line in stored),
                                  "unk_share": pytest.approx(recorded[side]["unk"] / sum(map(len, expected)),
                                                             abs=1e-6)}
    assert lines(out / "spm" / "valid.de") == lines(distill(config(teacher, tiny_en_de, corpus,
                                                                   tmp_path_factory.mktemp("t") / "o",
                                                                   strategy="greedy")).out_dir / "spm" / "valid.de")
    assert "Student vocabulary" in (out / "CARD.md").read_text()


def test_a_mix_of_a_student_data_set_is_binarized_in_the_students_tokens(tiny_en_de, corpus, student, student_set,
                                                                         tmp_path):
    """nat_kd.mix of a --student-data set: bin/ holds the mixed texts (the references on the lines the rule
    picks) encoded by the student's model and looked up in its dictionaries, as the generator writes its bin/;
    not the teacher's pieces looked up there (sequences the student's model does not write, 4% of them <unk>
    on this set). spm/ keeps the teacher's pieces, and meta.json's student_vocabulary, with the mix's <unk>
    counts, says what bin/ is."""
    import sentencepiece

    from nat_kd.analysis.metrics.sentence import SentenceScores
    from nat_kd.mix import main as mix_main

    kd, out = student_set.out_dir, tmp_path / "mixed"
    logprob = SentenceScores.read(kd / "scores.tsv")["logprob"]
    threshold = float(np.nanmedian(logprob))  # about half the lines take the reference
    replaced = (logprob < threshold).tolist()
    assert 0 < sum(replaced) < N_LINES - 1
    assert mix_main(["--distilled", str(kd), "--reference", str(corpus / "ref.de"), "--spm-model",
                     str(tiny_en_de / "spm.model"), "--logprob-below", repr(threshold), "--out", str(out)]) == 0
    references = lines(corpus / "ref.de")
    mixed = [r if swap else t for r, t, swap in zip(references, lines(kd / "valid.de"), replaced)]
    assert lines(out / "valid.de") == mixed
    kept = [i for i in range(N_LINES) if i + 1 != EMPTY_LINE]  # the set's bin/ left the empty source out
    expected, stored = student_encoded(student, "de", [mixed[i] for i in kept])
    assert binarized(out / "bin", "de", student / "bin") == stored
    meta = json.loads((out / "meta.json").read_text())
    recorded = meta["student_vocabulary"]
    assert recorded["data"] == str(student.resolve()) and recorded["dictionaries"] == str((student / "bin").resolve())
    assert (recorded["target"]["tokens"], recorded["target"]["unk"]) == (
        sum(map(len, expected)), sum(line.count("<unk>") for line in stored))
    # the source side is the set's, binarized in the student's tokens; the other splits are the student's
    for name in ("valid.en-de.en.bin", "valid.en-de.en.idx", "dict.en.txt", "dict.de.txt", "test.en-de.de.bin"):
        assert (out / "bin" / name).read_bytes() == (kd / "bin" / name).read_bytes(), name
    assert recorded["source"] == student_set.meta["student_vocabulary"]["source"]
    # spm/ in the teacher's tokens: the references as its model encodes them on the replaced lines
    teacher_model = sentencepiece.SentencePieceProcessor(model_file=str(tiny_en_de / "spm.model"))
    teacher_pieces = lines(kd / "spm" / "valid.de")
    assert lines(out / "spm" / "valid.de") == [
        " ".join(teacher_model.encode(r, out_type=str)) if swap else p
        for r, p, swap in zip(references, teacher_pieces, replaced)]
    assert "Student vocabulary" in (out / "CARD.md").read_text()


def test_a_mix_of_a_student_data_set_whose_student_data_is_gone_or_changed_is_refused(
        teacher, tiny_en_de, corpus, student, tmp_path, capsys):
    """The mix re-encodes the texts with the student's data the set records: if that folder is gone, or holds
    another tokenization or dictionaries than the generator's fingerprint recorded, it stops before writing."""
    moved = tmp_path / "student"
    shutil.copytree(student, moved)
    kd = distill(config(teacher, tiny_en_de, corpus, tmp_path / "kd", strategy="greedy",
                        student_data=str(moved))).out_dir
    capsys.readouterr()
    args = ["--distilled", str(kd), "--reference", str(corpus / "ref.de"), "--spm-model",
            str(tiny_en_de / "spm.model"), "--repeated", "--out", str(tmp_path / "mixed")]
    from nat_kd.mix import main as mix_main

    # prepared again with the teacher's vocabulary: another model and dictionaries in the same folder
    for name in ("spm.model", "bin/dict.en.txt", "bin/dict.de.txt"):
        shutil.copyfile(tiny_en_de / name, moved / name)
    assert mix_main(args) == 2
    assert capsys.readouterr().err == (
        f"error: {kd / 'meta.json'} records bin/ in the tokens of the student's data {moved.resolve()}, whose "
        "tokenization or dictionaries are not those its fingerprint.student_data records: restore it as it was, or "
        "regenerate the set with generate_distilled --student-data\n")
    shutil.rmtree(moved)
    assert mix_main(args) == 2
    assert capsys.readouterr().err == (
        f"error: {kd / 'meta.json'} records bin/ in the tokens of the student's data {moved.resolve()}, which is "
        "gone (no manifest.json): restore it as it was, or regenerate the set with generate_distilled "
        "--student-data\n")
    assert not (tmp_path / "mixed").exists()
