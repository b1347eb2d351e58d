"""--max-tokens auto: the sizing formula (nat_kd/distill/autobatch.py) against hand-computed values, its
refusals, and its record, on the CPU with torch.cuda's memory query stood in for."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import config, output_bytes
import torch

from nat_kd.distill.autobatch import MemoryDims, auto_batching, memory_dims, size_batches
from nat_kd.errors import SettingsError

GIB = 1 << 30
# kd_transformer_tiny with a 120-symbol dictionary: 3 decoder layers, 256 wide, FFN 1024, 4 heads
TINY = MemoryDims(decoder_layers=3, self_attention=256, cross_attention=256, encoder_output=256, encoder_ffn=1024,
                  encoder_heads=4, vocabulary=120)
SIZES = np.array([4, 10, 12, 12, 30])  # median 12, longest 30


def sized(**kw):
    args = dict(free=8 * GIB, total=80 * GIB, teacher_bytes=100_000_000, processes=1, shapes=[TINY], beam=5,
                fp16=False, longest_output=20, longest_source=30, sizes=SIZES, max_sentences=None, device="cuda:0")
    return size_batches(**{**args, **kw})


def test_the_formula_by_hand():
    """fp32, beam 5, T = 20 outputs, one process with 8 GiB free:
    A = 2*(3+1)*256*21*4 + 120*(4+8) + 24*120 + 12*22 = 172032 + 1440 + 2880 + 264 = 176616
    C = 2*3*256*4 + 2*256*4 + 9 + 4*22 = 6144 + 2048 + 9 + 88 = 8289
    E = (2*1024 + 4*256)*4 + (4+8)*4*30 = 12288 + 1440 = 13728
    budget = 8 GiB / 2 = 4294967296; sentences = 4294967296 // (5*(176616 + 12*8289)) = 4294967296 // 1380420
    = 3111; tokens = min(3111*12, 4294967296 // 13728) = min(37332, 312862) = 37332."""
    auto = sized()
    assert (auto.max_tokens, auto.max_sentences) == (37332, 3111)
    r = auto.record
    assert (r["per_hypothesis_bytes"], r["per_hypothesis_source_token_bytes"], r["encoding_bytes_per_token"],
            r["budget_bytes"], r["median_tokens"]) == (176616, 8289, 13728, 4294967296, 12)
    assert r["requested"] == "auto" and r["free_bytes"] == 8 * GIB and r["formula"] == "nat_kd/distill/autobatch.py"


def test_fp16_and_workers_sharing_the_gpu_by_hand():
    """fp16 (e = 2), --workers 2 with a 100 MB teacher: 8 GiB - 2*(100000000 + 1 GiB) = 6242450944 usable, half
    of it over 2 processes = 1560612736 each. A = 86016 + 1200 + 2880 + 264 = 90360, C = 3072 + 1024 + 97 = 4193,
    E = 3072*2 + 8*4*30 = 7104; sentences = 1560612736 // (5*(90360 + 12*4193)) = 1560612736 // 703380 = 2218,
    tokens = min(2218*12, 1560612736 // 7104) = 26616. --max-sentences 100 lowers the sentences, and so the
    tokens (100*12)."""
    auto = sized(fp16=True, processes=2)
    assert (auto.max_tokens, auto.max_sentences, auto.record["budget_bytes"]) == (26616, 2218, 1560612736)
    given = sized(fp16=True, processes=2, max_sentences=100)
    assert (given.max_tokens, given.max_sentences, given.record["max_sentences_given"]) == (1200, 100, 100)


def test_encoding_long_sources_caps_the_tokens():
    """A 10000-token source: E = 12288 + 12*4*10000 = 492288 bytes a token, so tokens = 4294967296 // 492288
    = 8724 (under the 37332 the decoding allows)."""
    auto = sized(longest_source=10000)
    assert (auto.max_tokens, auto.max_sentences) == (8724, 3111)


def test_an_ensemble_adds_its_models():
    """Two models: A = 2*(172032 + 1440) + 2880 + 264 = 350088, C = 2*(6144 + 2048 + 9) + 88 = 16490;
    sentences = 4294967296 // (5*(350088 + 12*16490)) = 4294967296 // 2739840 = 1567, tokens 1567*12 = 18804."""
    auto = sized(shapes=[TINY, TINY])
    assert (auto.record["per_hypothesis_bytes"], auto.record["per_hypothesis_source_token_bytes"]) == (350088, 16490)
    assert (auto.max_tokens, auto.max_sentences) == (18804, 1567)


def test_too_little_memory_is_one_line_naming_the_fix():
    with pytest.raises(SettingsError) as raised:
        sized(free=GIB // 1024)
    assert str(raised.value) == (
        "--max-tokens auto: 0.00 GiB free on cuda:0 hold batches of 0 tokens at beam 5, fewer than the longest "
        "sentence's 30: give --max-tokens 30 or more, or free the GPU, use fewer --workers, a smaller --beam or "
        "--max-len-b")
    with pytest.raises(SettingsError, match=r"shared by 2 processes \(--workers\)"):
        sized(free=2 * GIB, processes=2)  # two more teachers and contexts take all of it


def test_the_shape_is_read_from_a_fairseq_transformer():
    import fairseq_plugins.models  # noqa: F401  (registers the kd_* architectures)
    from fairseq_plugins.counting import build_model

    assert memory_dims(build_model("kd_transformer_tiny", 120)) == TINY
    with pytest.raises(SettingsError, match=r"^--max-tokens auto bounds the memory of fairseq transformer "
                       r"teachers; t.pt is a SimpleNamespace: give --max-tokens a number$"):
        memory_dims(SimpleNamespace(encoder=None, decoder=None), "t.pt")


def test_the_session_is_sized_from_torch_cudas_free_memory(monkeypatch):
    """auto_batching reads torch.cuda.mem_get_info on the run's device, the teacher's models and the corpus: on
    the tiny teacher, 8 GiB free and T = 20 (--max-len-a 0, --max-len-b 20), test_the_formula_by_hand's 37332
    tokens and 3111 sentences."""
    import fairseq_plugins.models  # noqa: F401
    from fairseq_plugins.counting import build_model

    from nat_kd.distill.decoding import DecodingSettings, build_strategy

    asked = []

    def mem_get_info(device=None):
        asked.append(device)
        return 8 * GIB, 80 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    decoding = DecodingSettings(beam=5, max_len_a=0, max_len_b=20)
    session = SimpleNamespace(
        cfg=SimpleNamespace(decoding=decoding, fp16=False, max_sentences=None),
        teacher=SimpleNamespace(models=(build_model("kd_transformer_tiny", 120),), paths=["t.pt"],
                                max_positions=(1024, 1024)),
        corpus=SimpleNamespace(source_tokens=[torch.ones(n, dtype=torch.long) for n in SIZES]),
        dataset=SimpleNamespace(num_tokens_vec=lambda ids: SIZES[ids]), strategy=build_strategy(decoding))
    auto = auto_batching(session, "cuda:1", processes=1)
    assert asked == [torch.device("cuda:1")]
    assert (auto.max_tokens, auto.max_sentences) == (37332, 3111)
    assert auto.record["longest_output"] == 20 and auto.record["total_bytes"] == 80 * GIB
    assert auto.record["teacher_bytes"] == 4 * sum(p.numel() for p in session.teacher.models[0].parameters()) + sum(
        b.numel() * b.element_size() for b in session.teacher.models[0].buffers())


# -- the command line and the pipeline ---------------------------------------------------------------------------

def test_a_cpu_run_refuses_auto_in_one_line(tmp_path, capsys):
    """Before anything is loaded or written: exit status 2, one line naming the flag and the fix."""
    from nat_kd.generate_distilled import main

    code = main(["--teacher-path", str(tmp_path / "t.pt"), "--source", str(tmp_path / "s.en"),
                 "--out", str(tmp_path / "o"), "--max-tokens", "auto", "--device", "cpu", "--no-progress-bar"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --max-tokens auto sizes batches to a GPU's free memory, and this run decodes on the CPU: give "
        "--max-tokens a number (default 12000), or add --device cuda"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["many", "0", "-5"])
def test_max_tokens_takes_a_number_or_auto(value, capsys):
    from nat_kd.distill.__main__ import build_parser

    parser = build_parser(["--teacher-path", "t.pt", "--out", "o"])
    assert parser.parse_args(["--teacher-path", "t.pt", "--out", "o", "--max-tokens", "auto"]).max_tokens == "auto"
    assert parser.parse_args(["--teacher-path", "t.pt", "--out", "o", "--max-tokens", "300"]).max_tokens == 300
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--teacher-path", "t.pt", "--out", "o", "--max-tokens", value])
    assert exited.value.code == 2
    assert f"argument --max-tokens: '{value}': give a number of tokens (e.g. 12000), or auto" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    ({"backend": "ctranslate2"}, r"^--max-tokens auto sizes the fairseq backend's beam search to the GPU's memory; "
                                 r"with --backend ctranslate2 give --max-tokens a number$"),
    ({"num_shards": 2, "shard_id": 0}, r"^--max-tokens auto: the 2 shards must share one plan of batches, and each "
                                       r"would size its own to its GPU: give --max-tokens a number")])
def test_what_auto_cannot_size_is_refused(tmp_path, options, message):
    from nat_kd.distill import DistillConfig

    cfg = DistillConfig(teachers=[str(tmp_path / "t.pt")], out_dir=str(tmp_path / "o"), max_tokens="auto", **options)
    with pytest.raises(SettingsError, match=message):
        cfg.check()
    DistillConfig(teachers=[str(tmp_path / "t.pt")], out_dir=str(tmp_path / "o"), max_tokens=300, **options).check()


def test_the_plan_keeps_autos_batches_for_a_rerun_and_meta_records_them(teacher, tiny_en_de, corpus,  # noqa: F811
                                                                        tmp_path, monkeypatch):
    """The pipeline on the CPU with the sizing stood in for (it needs a GPU): the chosen limits batch the corpus,
    are saved with the plan and recorded in meta.json; a run stopped after one chunk resumes from the saved plan
    without sizing again, and gives what the same limits given as numbers give."""
    from nat_kd.distill import distill, pipeline
    from nat_kd.distill.autobatch import AutoBatching
    
    chosen = AutoBatching(max_tokens=1100, max_sentences=6,
                          record={"requested": "auto", "free_bytes": 8 * GIB, "budget_bytes": 1234})
    sized = []

    def auto_batching(session, device, processes):
        sized.append((device, processes))
        return chosen

    real_decode = pipeline.decode_pending

    def stop_after_one_chunk(session, store, chunks, pending, *args):
        real_decode(session, store, chunks, pending[:1], *args)
        raise RuntimeError("stopped")

    monkeypatch.setattr(pipeline, "check_auto_device", lambda cfg, device: None)
    monkeypatch.setattr(pipeline, "auto_batching", auto_batching)
    monkeypatch.setattr(pipeline, "decode_pending", stop_after_one_chunk)
    kw = dict(strategy="beam", beam=2, chunk_sentences=6)
    out = tmp_path / "auto"
    with pytest.raises(RuntimeError, match="stopped"):
        distill(config(teacher, tiny_en_de, corpus, out, max_tokens="auto", **kw))
    plan = json.loads((tmp_path / "auto.partial" / "plan.json").read_text())
    assert plan["batching"] == {"max_tokens": 1100, "max_sentences": 6, "record": chosen.record}
    assert max(len(b) for chunk in plan["chunks"] for b in chunk) == 6 and len(plan["chunks"]) > 2
    assert sized == [("cpu", 1)]

    monkeypatch.setattr(pipeline, "decode_pending", real_decode)
    monkeypatch.setattr(pipeline, "auto_batching", lambda *a: pytest.fail("sized again instead of the saved plan"))
    resumed = distill(config(teacher, tiny_en_de, corpus, out, max_tokens="auto", **kw))
    batching = resumed.meta["batching"]
    assert (batching["max_tokens"], batching["max_sentences"], batching["auto"]) == (1100, 6, chosen.record)
    assert resumed.meta["fingerprint"]["max_tokens"] == "auto"
    given = distill(config(teacher, tiny_en_de, corpus, tmp_path / "given", max_tokens=1100, max_sentences=6,
                           **kw))
    ours, theirs = output_bytes(out), output_bytes(given.out_dir)
    for meta in (ours["meta"], theirs["meta"]):
        meta.pop("fingerprint")
        meta["batching"].pop("auto", None)
    assert ours == theirs


def test_a_left_out_max_tokens_is_the_devices_default_or_the_folders_own_run(teacher, tiny_en_de, corpus,  # noqa: F811
                                                                             tmp_path, monkeypatch):
    """No --max-tokens: 12000 on the CPU, 32000 on a GPU; but where the output folder holds a saved plan (or a
    finished set), that run's, so that a rerun on another device finishes the same batches instead of refusing
    the folder as another run's."""
    from nat_kd.distill import distill, pipeline

    kw = dict(strategy="beam", beam=2, chunk_sentences=6)
    out = tmp_path / "set"
    left_out = config(teacher, tiny_en_de, corpus, out, **kw)
    assert left_out.max_tokens is None
    assert [pipeline.with_batch_default(left_out, gpu).max_tokens for gpu in (False, True)] == [12000, 32000]
    assert pipeline.with_batch_default(config(teacher, tiny_en_de, corpus, out, max_tokens=300, **kw),
                                       True).max_tokens == 300

    real_decode = pipeline.decode_pending

    def stop_after_one_chunk(session, store, chunks, pending, *args):
        real_decode(session, store, chunks, pending[:1], *args)
        raise RuntimeError("stopped")

    monkeypatch.setattr(pipeline, "decode_pending", stop_after_one_chunk)
    with pytest.raises(RuntimeError, match="stopped"):
        distill(config(teacher, tiny_en_de, corpus, out, max_tokens=1100, **kw))
    assert [pipeline.with_batch_default(left_out, gpu).max_tokens for gpu in (False, True)] == [1100, 1100]
    monkeypatch.setattr(pipeline, "decode_pending", real_decode)
    finished = distill(left_out)
    assert finished.meta["batching"]["max_tokens"] == 1100 and not (tmp_path / "set.partial").exists()
    assert pipeline.with_batch_default(left_out, True).max_tokens == 1100  # from the finished set's meta.json
    assert distill(left_out).meta == finished.meta  # already complete: nothing decoded again
    fresh = distill(config(teacher, tiny_en_de, corpus, tmp_path / "fresh", **kw))
    assert fresh.meta["batching"]["max_tokens"] == 12000
