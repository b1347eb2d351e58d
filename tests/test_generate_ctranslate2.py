"""The ctranslate2 backend of nat_kd.generate_distilled on the micro teacher, against the fairseq backend."""
import ctypes
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import N_LINES, cli, config, kill_after_first_chunk_and_resume, lines, output_bytes, requires_cuda

from nat_kd.analysis.metrics.sentence import SentenceScores
from nat_kd.distill import DistillConfig, distill
from nat_kd.distill.backends import BackendSettings
from nat_kd.distill.backends.ctranslate2 import CUBLAS_LIBRARY
from nat_kd.distill.decoding import DecodingSettings
from nat_kd.errors import SettingsError

ctranslate2 = pytest.importorskip("ctranslate2")


def ct2(teacher, tiny_en_de, corpus, out, cache, **kw):  # noqa: F811
    return config(teacher, tiny_en_de, corpus, out, backend="ctranslate2", ct2_cache=str(cache), **kw)


def teacher_scores(loaded, pairs, lenpen: float) -> list[float]:
    """fairseq's beam score of each (sentence id, pieces): the teacher-forced log-probability of the pieces and
    EOS, divided by their number ** lenpen (what SequenceGenerator ranks hypotheses by)."""
    model, tgt = loaded.teacher, loaded.teacher.tgt_dict
    out = []
    for sentence_id, pieces in pairs:
        src = loaded.corpus.source_tokens[sentence_id].unsqueeze(0)
        target = tgt.encode_line(pieces, add_if_not_exist=False, append_eos=True).long().unsqueeze(0)
        previous = torch.cat([target.new_full((1, 1), tgt.eos()), target[:, :-1]], dim=1)
        log_probs = model.log_probs(src, torch.tensor([src.size(1)]), previous)
        out.append(log_probs.gather(-1, target.unsqueeze(-1)).sum().item() / target.size(1) ** lenpen)
    return out


MAX_LEN = 20


@pytest.mark.parametrize("strategy, beam", [("beam", 4), ("greedy", 1)])
@pytest.mark.slow
def test_hypotheses_equal_fairseqs_or_tie(teacher, tiny_en_de, tmp_path, strategy, beam):  # noqa: F811
    """The whole valid split (1014 sentences) against the fairseq backend. Hypotheses that end before the
    length limit are the same, or differ where fairseq scores the two the same within 1e-5. At the limit the
    engines differ by design (docs/generate_distilled.md): fairseq forces EOS after MAX_LEN tokens and ranks
    the beam with its probability, CTranslate2 stops after MAX_LEN tokens without it; the half-trained micro
    teacher runs into the limit often. Both kinds are counted and printed (pytest -s)."""
    from nat_kd.distill.loaded import LoadedRun

    outs = {}
    for backend in ("fairseq", "ctranslate2"):
        cfg = DistillConfig(teachers=[str(teacher)], out_dir=str(tmp_path / backend), split="valid",
                            spm_model=str(tiny_en_de / "spm.model"), data_dir=str(tiny_en_de / "bin"),
                            decoding=DecodingSettings(strategy=strategy, beam=beam, max_len_b=MAX_LEN),
                            max_tokens=300, workers=1, threads=1, progress_bar=False, backend=backend,
                            ct2_cache=str(tmp_path / "c"))
        outs[backend] = lines(distill(cfg).out_dir / "spm" / "valid.de")
    theirs, ours = outs["fairseq"], outs["ctranslate2"]
    assert len(ours) == len(theirs) == 1014
    at_limit = [i for i in range(len(ours)) if MAX_LEN in (len(ours[i].split()), len(theirs[i].split()))]
    differing = [i for i in range(len(ours)) if ours[i] != theirs[i] and i not in at_limit]
    differing_at_limit = [i for i in at_limit if ours[i] != theirs[i]]
    loaded = LoadedRun(cfg)
    fairseq_best = teacher_scores(loaded, [(i, theirs[i]) for i in differing], 1.0)
    ct2_best = teacher_scores(loaded, [(i, ours[i]) for i in differing], 1.0)
    print(f"\n{strategy}: {len(ours) - len(at_limit)} hypotheses end before the length limit, {len(differing)} of "
          f"them differ; {len(at_limit)} reach it, {len(differing_at_limit)} of them differ")
    for i, a, b in zip(differing, fairseq_best, ct2_best):
        print(f"  line {i + 1}: fairseq {a:.7f} {theirs[i]!r}\n  ctranslate2 {b:.7f} {ours[i]!r}")
    for i in differing_at_limit[:3]:
        print(f"  at the limit, line {i + 1}: fairseq {theirs[i]!r}\n  ctranslate2 {ours[i]!r}")
    assert all(abs(a - b) <= 1e-5 for a, b in zip(fairseq_best, ct2_best))
    # scores.tsv's logprob has one definition (the mean over the tokens and EOS): the same hypothesis gets
    # nearly the same value from both engines (CTranslate2's was higher by up to 0.18% here, docs/
    # generate_distilled.md); a value not divided by the length, or without EOS, is off by far more
    logprobs = {name: SentenceScores.read(tmp_path / name / "scores.tsv")["logprob"] for name in outs}
    same = [i for i in range(len(ours)) if ours[i] == theirs[i] and i not in at_limit]
    assert logprobs["ctranslate2"][same] == pytest.approx(logprobs["fairseq"][same], rel=5e-3)
    if strategy == "greedy":  # the same argmax, token by token, up to the limit (the micro teacher always reaches it)
        assert ours == theirs
    else:
        assert len(same) > 300  # enough sentences end on their own to mean something
        assert all(len(ours[i].split()) == MAX_LEN for i in differing_at_limit)  # CTranslate2 stopped at the limit


@pytest.mark.slow
def test_killed_run_resumes_to_identical_output(teacher, tiny_en_de, corpus, tmp_path):  # noqa: F811
    """topk: sampled, so it also shows that per-batch seeding survives a kill, a new process and resumption."""
    settings = dict(strategy="topk", max_tokens=1100, max_sentences=6, chunk_sentences=6)
    whole = distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "whole", tmp_path / "c", **settings)).out_dir
    out = tmp_path / "killed"
    command = cli(teacher, tiny_en_de, corpus, out, "--strategy", "topk", "--max-tokens", "1100",
                  "--max-sentences", "6", "--chunk-sentences", "6", "--backend", "ctranslate2",
                  "--ct2-cache", str(tmp_path / "c"))
    kill_after_first_chunk_and_resume(command, out)
    assert output_bytes(out) == output_bytes(whole)


def test_conversion_is_cached_and_reused(teacher, tiny_en_de, corpus, tmp_path, monkeypatch):  # noqa: F811
    from ctranslate2.converters import FairseqConverter

    conversions = []
    convert = FairseqConverter.convert
    monkeypatch.setattr(FairseqConverter, "convert", lambda self, *a, **k: conversions.append(1) or convert(self, *a, **k))
    first = distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "a", tmp_path / "c", strategy="greedy"))
    models = [p for p in (tmp_path / "c").iterdir() if p.is_dir()]
    assert conversions == [1] and len(models) == 1 and (models[0] / "model.bin").is_file()
    written = (models[0] / "model.bin").stat().st_mtime_ns
    second = distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "b", tmp_path / "c", strategy="beam", beam=3))
    assert conversions == [1] and (models[0] / "model.bin").stat().st_mtime_ns == written
    assert [p for p in (tmp_path / "c").iterdir() if p.is_dir()] == models
    assert first.meta["backend"] == {"name": "ctranslate2", "ctranslate2_version": ctranslate2.__version__,
                                     "compute_type": "float32", "sub_batch_tokens": 2048}
    assert second.meta["sentences"] == N_LINES
    # by default the cache is beside the output folder
    distill(config(teacher, tiny_en_de, corpus, tmp_path / "d" / "o", strategy="greedy", backend="ctranslate2"))
    assert conversions == [1, 1] and list((tmp_path / "d" / ".ctranslate2-cache").glob("*/model.bin"))


def test_ensemble_and_other_options_are_refused_with_the_fix(teacher, tiny_en_de, corpus, tmp_path):  # noqa: F811
    cfg = ct2(teacher, tiny_en_de, corpus, tmp_path / "e", tmp_path / "c", strategy="greedy")
    cfg.teachers = [str(teacher), str(teacher)]
    with pytest.raises(SettingsError, match=r"not an ensemble of 2 .*--backend fairseq"):
        distill(cfg)
    with pytest.raises(SettingsError, match=r"--max-len-a 0 or --backend fairseq"):
        distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "a", tmp_path / "c", max_len_a=1.0))
    with pytest.raises(SettingsError, match=r"--compute-type float16: this machine's cpu supports"):
        distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "h", tmp_path / "c", compute_type="float16", device="cpu"))
    with pytest.raises(SettingsError, match=r"--compute-type int8 is for --backend ctranslate2"):
        distill(config(teacher, tiny_en_de, corpus, tmp_path / "f", compute_type="int8"))
    with pytest.raises(SettingsError, match=r"use --compute-type float16"):
        distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "g", tmp_path / "c", fp16=True))
    assert not any((tmp_path / name).exists() for name in "eahfg") and not (tmp_path / "c").exists()


def test_check_against_fairseq_is_recorded(teacher, tiny_en_de, corpus, tmp_path, capsys):  # noqa: F811
    from nat_kd.generate_distilled import main

    code = main(cli(teacher, tiny_en_de, corpus, tmp_path / "o", "--strategy", "greedy", "--backend", "ctranslate2",
                    "--ct2-cache", str(tmp_path / "c"), "--check-against-fairseq", "20")[3:])
    assert code == 0
    check = json.loads((tmp_path / "o" / "meta.json").read_text())["check_against_fairseq"]
    # greedy: the same argmax token by token (test_hypotheses_equal_fairseqs_or_tie), so the BLEU is the same too
    assert check["sentences"] == 20 and check["identical"] == 20 and check["bleu_difference"] == 0
    assert "against the fairseq backend on 20 sentences: 20 identical hypotheses (100.00%)" in capsys.readouterr().out


def loads(library: str) -> bool:
    try:
        ctypes.CDLL(library)
        return True
    except OSError:
        return False


# CTranslate2's wheels decode on a GPU only with CUDA 12's cuBLAS (test_cli_without_cuda_12_exits_2_with_one_line)
requires_cublas_12 = pytest.mark.skipif(not loads(CUBLAS_LIBRARY), reason=f"CTranslate2 needs {CUBLAS_LIBRARY}")


@requires_cuda
@pytest.mark.parametrize("backend, options, at_least", [
    ("fairseq", {}, N_LINES - 2), ("fairseq", {"fp16": True}, N_LINES // 2),
    *(pytest.param("ctranslate2", {"compute_type": compute_type}, at_least, marks=requires_cublas_12)
      for compute_type, at_least in (("float32", N_LINES - 2), ("float16", N_LINES // 2),
                                     ("bfloat16", N_LINES // 2)))])
def test_gpu_decodes_as_the_cpu_does(teacher, tiny_en_de, corpus, tmp_path, backend, options, at_least):  # noqa: F811
    """Greedy on the GPU against the CPU: float32 the same up to rounding, half precision mostly the same."""
    kw = dict(strategy="greedy", backend=backend, ct2_cache=str(tmp_path / "c"))
    cpu = distill(config(teacher, tiny_en_de, corpus, tmp_path / "cpu", device="cpu", **kw))
    gpu = distill(config(teacher, tiny_en_de, corpus, tmp_path / "gpu", device="cuda", **kw, **options))
    assert gpu.meta["timing"]["device"].startswith("cuda") and gpu.meta["sentences"] == N_LINES
    assert gpu.meta["backend"].get("fp16", False) == options.get("fp16", False)
    assert gpu.meta["backend"].get("compute_type", "float32") == options.get("compute_type", "float32")
    same = sum(a == b for a, b in zip(lines(cpu.out_dir / "valid.de"), lines(gpu.out_dir / "valid.de")))
    assert same >= at_least, f"{same} of {N_LINES} the same"


@requires_cuda
def test_gpu_decodes_the_same_in_processes_sharing_it(teacher, tiny_en_de, corpus, tmp_path):  # noqa: F811
    """--workers 2 on one GPU: two processes, each its own teacher, the same batches: the same bytes."""
    kw = dict(strategy="beam", beam=4, device="cuda", max_sentences=8, chunk_sentences=8)
    one = distill(config(teacher, tiny_en_de, corpus, tmp_path / "one", **kw))
    two = distill(config(teacher, tiny_en_de, corpus, tmp_path / "two", workers=2, **kw))
    assert two.meta["timing"]["workers"] == 2 and two.meta["batching"]["chunks"] >= 4
    assert output_bytes(two.out_dir) == output_bytes(one.out_dir)


def test_fp16_needs_a_gpu(teacher, tiny_en_de, corpus, tmp_path):  # noqa: F811
    with pytest.raises(SettingsError, match=r"--fp16 .* add --device cuda"):
        distill(config(teacher, tiny_en_de, corpus, tmp_path / "o", device="cpu", fp16=True))


@pytest.mark.slow
def test_sampling_is_reproducible_across_shards_and_workers_but_not_batchings(teacher, tiny_en_de, corpus,  # noqa: F811
                                                                              tmp_path):
    kw = dict(strategy="sampling", seed=3, max_sentences=8, chunk_sentences=8)
    whole = distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "whole", tmp_path / "c", **kw)).out_dir
    out = tmp_path / "sharded"
    assert not distill(ct2(teacher, tiny_en_de, corpus, out, tmp_path / "c", num_shards=2, shard_id=1, workers=2,
                           **kw)).complete
    assert distill(ct2(teacher, tiny_en_de, corpus, out, tmp_path / "c", num_shards=2, shard_id=0, **kw)).complete
    assert output_bytes(out) == output_bytes(whole)
    samples = lines(whole / "valid.de")
    assert len(set(samples)) > N_LINES // 2  # really sampled
    # other batches, other samples (documented: CTranslate2 has one random stream per batch, not per sentence)
    other = distill(ct2(teacher, tiny_en_de, corpus, tmp_path / "other", tmp_path / "c",
                        **{**kw, "max_sentences": 5})).out_dir
    assert sum(a != b for a, b in zip(lines(other / "valid.de"), samples)) > N_LINES // 2
    meta = json.loads((whole / "meta.json").read_text())
    assert "another batching gives other samples" in meta["backend"]["sampling_reproducible"]


@pytest.mark.slow
def test_strategies_map_onto_ctranslate2s_options(teacher, tiny_en_de, corpus, tmp_path):  # noqa: F811
    import sacrebleu

    def run(name, **kw):
        return lines(distill(ct2(teacher, tiny_en_de, corpus, tmp_path / name, tmp_path / "c", **kw)).out_dir
                     / "valid.de")

    greedy = run("greedy", strategy="greedy")
    assert run("top1", strategy="topk", top_k=1) == greedy  # sampling from the single best token is greedy
    assert run("nucleus", strategy="topp", top_p=1e-6) == greedy  # so is a nucleus of the best token alone
    refs, metric = lines(corpus / "ref.de"), sacrebleu.BLEU(effective_order=True)
    beam = [metric.sentence_score(h, [r]).score for h, r in zip(run("beam", strategy="beam", beam=4), refs)]
    inter = [metric.sentence_score(h, [r]).score for h, r in zip(run("inter", strategy="seq-inter", beam=4), refs)]
    assert all(i >= b - 1e-9 for i, b in zip(inter, beam)) and sum(inter) > sum(beam)  # beam's best is a candidate


@pytest.mark.parametrize("arch, overrides, message", [
    ("kd_cmlm_tiny", {}, r"is a CMLMNATransformerModel \(kd_cmlm_tiny\), not an autoregressive transformer"),
    ("kd_transformer_tiny", {"adaptive_softmax_cutoff": "50,100"}, r"uses an adaptive softmax"),
    ("kd_transformer_tiny", {}, None)])
def test_what_ctranslate2_cannot_convert_is_refused_first(arch, overrides, message):
    """A NAT teacher, or one with an adaptive softmax: an error naming the fairseq backend, before any conversion."""
    from types import SimpleNamespace

    import fairseq_plugins.models  # noqa: F401  (registers the kd_* architectures)
    from fairseq_plugins.counting import build_model
    from nat_kd.distill.backends.ctranslate2 import check

    model = build_model(arch, 120, **overrides)
    settings = BackendSettings(name="ctranslate2", decoding=DecodingSettings())
    teacher = SimpleNamespace(models=(model,), paths=["teacher.pt"], archs=[arch])
    if message is None:
        check(settings, teacher)  # the transformer teacher itself is accepted
        return
    with pytest.raises(SettingsError, match=message + r".*--backend fairseq"):
        check(settings, teacher)


# What CTranslate2 4.8.5 and dlopen raise where the GPU cannot be used: ctypes' text for a missing cuBLAS 12 (on a
# CUDA 13 machine there is only libcublas.so.13), CTranslate2's when its own dlopen fails at the first translation
# (src/cuda/cublas_stub.cc), and its "CUDA failed with error " + cudaGetErrorString (src/cuda/utils.h)
NO_CUBLAS = "libcublas.so.12: cannot open shared object file: No such file or directory"
CT2_NO_CUBLAS = "Library libcublas.so.12 is not found or cannot be loaded"
NO_GPU = "CUDA failed with error no CUDA-capable device is detected"
OLD_DRIVER = "CUDA failed with error CUDA driver version is insufficient for CUDA runtime version"


@pytest.fixture
def gpu_machine(monkeypatch):
    """CTranslate2 on a machine with one GPU and, unless the test says otherwise, every library it loads; each
    ``fail[name]`` makes that step raise its exception instead."""
    import ctypes

    from nat_kd.distill.backends import ctranslate2 as backend

    fail, load = {}, ctypes.CDLL

    def get_supported_compute_types(device, index=0):
        if "compute_types" in fail:
            raise fail["compute_types"]
        return {"float32", "float16", "int8"} if device == "cuda" else {"float32", "int8"}

    def cdll(name, *args, **kw):
        if name in fail:
            raise fail[name]
        return load("libc.so.6") if name in (backend.CUBLAS_LIBRARY, "libcuda.so.1") else load(name, *args, **kw)

    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", get_supported_compute_types)
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    monkeypatch.setattr(backend.ctypes, "CDLL", cdll)
    monkeypatch.setitem(sys.modules, "nvidia", None)  # pip's nvidia-* packages not installed
    return fail


def fairseq_teacher():
    from types import SimpleNamespace

    import fairseq_plugins.models  # noqa: F401  (registers the kd_* architectures)
    from fairseq_plugins.counting import build_model

    return SimpleNamespace(models=(build_model("kd_transformer_tiny", 120),), paths=["teacher.pt"],
                           archs=["kd_transformer_tiny"])


FAIRSEQ_FIX = "or use --backend fairseq (the default), which runs on the CUDA that the installed torch was built for"
CUBLAS_FIX = (f"install it with setup.cfg's extra: {sys.executable} -m pip install -e '.[cuda12-cublas]' in nat-kd's "
              "folder (pip's nvidia-cublas-cu12, which the backend then loads itself), " + FAIRSEQ_FIX)


@pytest.mark.parametrize("failing, error, message", [
    ("libcublas.so.12", OSError(NO_CUBLAS), "--device cuda: CTranslate2 4.8.5 cannot load libcublas.so.12, CUDA 12's "
     "cuBLAS, which its wheels need whatever CUDA this machine has: " + CUBLAS_FIX),
    ("compute_types", RuntimeError(NO_GPU), "--device cuda: CTranslate2 4.8.5 finds no CUDA GPU on this machine (no "
     "CUDA-capable device is detected): use --device cpu, or run where a GPU is"),
    ("compute_types", RuntimeError(OLD_DRIVER), "--device cuda: the NVIDIA driver is older than CUDA 12, which "
     "CTranslate2 4.8.5's wheels are built for (CUDA driver version is insufficient for CUDA runtime version): "
     "install a driver for CUDA 12 or later, " + FAIRSEQ_FIX)])
def test_a_gpu_ctranslate2_cannot_use_is_one_line_naming_the_fix(gpu_machine, failing, error, message):
    """check(), before anything is converted: CTranslate2 loads cuBLAS only at the first translation, so the check
    loads it itself, as CTranslate2 would (dlopen of libcublas.so.12)."""
    from nat_kd.distill.backends.ctranslate2 import check

    assert ctranslate2.__version__ == "4.8.5"  # the version whose errors these are (setup.cfg pins it)
    settings = BackendSettings(name="ctranslate2", decoding=DecodingSettings(), device="cuda")
    check(settings, fairseq_teacher())  # the machine with everything: accepted
    gpu_machine[failing] = error
    with pytest.raises(SettingsError) as raised:
        check(settings, fairseq_teacher())
    assert str(raised.value) == message


def system_library(name: str) -> Path:
    """The file of a shared library this process has loaded (from /proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if path.startswith("/") and Path(path).name == name:
            return Path(path)
    pytest.skip(f"{name} is not loaded in this process")


def fake_nvidia_package(root: Path, names) -> Path:
    """A site-packages folder holding an ``nvidia.cublas`` package whose lib/ has ``names``: copies of the
    system's libm, real shared libraries that load anywhere, standing in for cuBLAS. Regular packages (with
    __init__.py), so that they come before any ``nvidia`` namespace already installed."""
    lib = root / "nvidia" / "cublas" / "lib"
    lib.mkdir(parents=True)
    for package in (root / "nvidia", root / "nvidia" / "cublas"):
        (package / "__init__.py").write_text("")
    for name in names:
        shutil.copyfile(system_library("libm.so.6"), lib / name)
    return lib


@pytest.fixture
def loads_and_imports(gpu_machine, monkeypatch):
    """Every library loaded by path (the backend's ctypes.CDLL) and every import of ctranslate2, in order; the
    backend's once-per-process record cleared, and no nvidia package visible until a test makes one."""
    import builtins

    from nat_kd.distill.backends import ctranslate2 as backend

    events, cdll, real_import = [], backend.ctypes.CDLL, builtins.__import__

    def load(name, *args, **kw):
        if "/" in str(name):
            events.append(("load", str(name), kw.get("mode")))
        return cdll(name, *args, **kw)

    def recording_import(name, *args, **kw):
        if name.split(".")[0] == "ctranslate2":
            events.append(("import", name))
        return real_import(name, *args, **kw)

    monkeypatch.setattr(backend.ctypes, "CDLL", load)
    monkeypatch.setattr(builtins, "__import__", recording_import)
    monkeypatch.setattr(backend, "_pip_cublas", None)
    return events


def use_site(monkeypatch, site: Path) -> None:
    """``site`` first on sys.path; the nvidia modules imported from it are gone again after the test."""
    for name in ("nvidia", "nvidia.cublas"):
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(site))


def test_pip_cublas_12_is_loaded_before_ctranslate2_once_per_process(loads_and_imports, tmp_path, monkeypatch):
    """Where nvidia-cublas-cu12 is installed, ``--device cuda`` loads its libcublasLt.so.12 then libcublas.so.12,
    by path and RTLD_GLOBAL, before ctranslate2 is imported, so that CTranslate2's own dlopen by name finds them
    without LD_LIBRARY_PATH (CTranslate2 issue #1933; the fix of faster-whisper issue #153)."""
    from nat_kd.distill.backends.ctranslate2 import check, import_ctranslate2

    lib = fake_nvidia_package(tmp_path / "site", ["libcublasLt.so.12", "libcublas.so.12"])
    teacher = fairseq_teacher()
    use_site(monkeypatch, tmp_path / "site")
    check(BackendSettings(name="ctranslate2", decoding=DecodingSettings(), device="cuda:0"), teacher)
    expected = [("load", str(lib / "libcublasLt.so.12"), ctypes.RTLD_GLOBAL),
                ("load", str(lib / "libcublas.so.12"), ctypes.RTLD_GLOBAL)]
    assert loads_and_imports[:3] == [*expected, ("import", "ctranslate2")]
    mapped = Path("/proc/self/maps").read_text()
    assert str(lib / "libcublasLt.so.12") in mapped and str(lib / "libcublas.so.12") in mapped  # really loaded
    # once per process: a second check, the backend's own import and a worker's all find them loaded
    check(BackendSettings(name="ctranslate2", decoding=DecodingSettings(), device="cuda"), teacher)
    import_ctranslate2("cuda:1")
    assert [e for e in loads_and_imports if e[0] == "load"] == expected


@pytest.mark.parametrize("installed", [None, ["libcublas.so.13", "libcublasLt.so.13"], ["libcublas.so.12"]])
def test_without_pip_cublas_12_nothing_is_loaded_and_nothing_said(loads_and_imports, tmp_path, monkeypatch,
                                                                  capsys, caplog, installed):
    """No nvidia package, another CUDA's cuBLAS in its place, or an incomplete one: nothing loaded, nothing
    printed or logged; CTranslate2 is imported as it was."""
    from nat_kd.distill.backends.ctranslate2 import import_ctranslate2, load_pip_cublas

    if installed is not None:
        fake_nvidia_package(tmp_path / "site", installed)
        use_site(monkeypatch, tmp_path / "site")
    caplog.set_level("DEBUG")
    assert import_ctranslate2("cuda") is ctranslate2 and load_pip_cublas("cuda") == []
    assert loads_and_imports == [("import", "ctranslate2")]
    assert capsys.readouterr() == ("", "") and caplog.records == []


def test_a_cpu_run_neither_looks_for_nor_loads_pip_cublas(loads_and_imports, tmp_path, monkeypatch):
    from nat_kd.distill.backends import ctranslate2 as backend

    fake_nvidia_package(tmp_path / "site", ["libcublasLt.so.12", "libcublas.so.12"])
    use_site(monkeypatch, tmp_path / "site")

    def looked():
        raise AssertionError("a CPU run looked for nvidia-cublas-cu12")

    monkeypatch.setattr(backend, "pip_cublas_folder", looked)
    backend.check(BackendSettings(name="ctranslate2", decoding=DecodingSettings(), device="cpu"), fairseq_teacher())
    assert backend.import_ctranslate2("cpu") is ctranslate2
    assert [e for e in loads_and_imports if e[0] == "load"] == [] and backend._pip_cublas is None
    with pytest.raises(AssertionError, match="looked for"):  # where a GPU run looks
        backend.load_pip_cublas("cuda")


def test_a_pip_cublas_that_does_not_load_is_one_line(loads_and_imports, tmp_path, monkeypatch):
    from nat_kd.distill.backends.ctranslate2 import check

    lib = fake_nvidia_package(tmp_path / "site", ["libcublasLt.so.12"])
    (lib / "libcublas.so.12").write_bytes(b"not a shared library")
    use_site(monkeypatch, tmp_path / "site")
    settings = BackendSettings(name="ctranslate2", decoding=DecodingSettings(), device="cuda")
    with pytest.raises(SettingsError, match=rf"^--device cuda: cannot load {re.escape(str(lib))}/libcublas.so.12 "
                       r"of the installed nvidia-cublas-cu12 \(.*\): reinstall it \(.* -m pip install "
                       r"--force-reinstall nvidia-cublas-cu12\), or use --backend fairseq$"):
        check(settings, fairseq_teacher())


def test_the_session_loads_pip_cublas_before_the_teacher(loads_and_imports, tmp_path, monkeypatch):
    """A published teacher's folder imports ctranslate2 as it loads (teachers.py): the loaded loads pip's cuBLAS
    before any teacher; for the fairseq backend it does not."""
    from nat_kd.distill.loaded import LoadedRun

    lib = fake_nvidia_package(tmp_path / "site", ["libcublasLt.so.12", "libcublas.so.12"])
    use_site(monkeypatch, tmp_path / "site")

    class TeacherLoading(Exception):
        pass

    def load_teacher(self, cfg):
        raise TeacherLoading

    monkeypatch.setattr(LoadedRun, "_load_fairseq_teacher", load_teacher)
    for backend in ("fairseq", "ctranslate2"):
        cfg = DistillConfig(teachers=[str(tmp_path / "t.pt")], out_dir=str(tmp_path / "o"), backend=backend)
        with pytest.raises(TeacherLoading):
            LoadedRun(cfg, "cuda")
    assert [e[1] for e in loads_and_imports] == [str(lib / "libcublasLt.so.12"), str(lib / "libcublas.so.12")]


def test_no_driver_at_all_reads_as_no_driver_not_an_old_one(gpu_machine):
    """CUDA's runtime says "driver version is insufficient" also where there is no driver (this CPU machine's
    case)."""
    from nat_kd.distill.backends.ctranslate2 import check

    gpu_machine.update(compute_types=RuntimeError(OLD_DRIVER), **{"libcuda.so.1": OSError("libcuda.so.1: cannot "
                       "open shared object file: No such file or directory")})
    with pytest.raises(SettingsError, match=r"^--device cuda:1: no NVIDIA driver on this machine \(libcuda.so.1 "
                       r"cannot be loaded; .*\): use --device cpu, or install the driver$"):
        check(BackendSettings(name="ctranslate2", decoding=DecodingSettings(), device="cuda:1"), fairseq_teacher())


def test_cublas_missing_at_the_first_translation_is_the_same_line(gpu_machine):
    """Where check()'s look found cuBLAS but CTranslate2's own dlopen does not, its error at decoding is the same
    line; other errors keep their traceback, and on the CPU nothing is read as a GPU's error."""
    from types import SimpleNamespace

    from nat_kd.distill.backends.ctranslate2 import CTranslate2Backend

    gpu = SimpleNamespace(device="cuda", device_name="cuda", model_dir="m", target_prefix=[])
    with pytest.raises(SettingsError) as raised:
        with CTranslate2Backend.position_limit(gpu):
            raise RuntimeError(CT2_NO_CUBLAS)
    assert str(raised.value).startswith("--device cuda: CTranslate2 4.8.5 cannot load libcublas.so.12, CUDA 12's "
                                        "cuBLAS") and str(raised.value).endswith(CUBLAS_FIX)
    for backend, error in [(gpu, "CUDA failed with error out of memory"),
                           (SimpleNamespace(**{**vars(gpu), "device": "cpu"}), CT2_NO_CUBLAS)]:
        with pytest.raises(RuntimeError, match=error):
            with CTranslate2Backend.position_limit(backend):
                raise RuntimeError(error)


def test_cli_without_cuda_12_exits_2_with_one_line(teacher, tiny_en_de, corpus, tmp_path, gpu_machine,  # noqa: F811
                                                   capsys):
    """``--backend ctranslate2 --device cuda`` on a machine with CUDA 13 alone: exit status 2, one line, no traceback,
    nothing converted or written."""
    from nat_kd.generate_distilled import main

    gpu_machine["libcublas.so.12"] = OSError(NO_CUBLAS)
    code = main(cli(teacher, tiny_en_de, corpus, tmp_path / "o", "--backend", "ctranslate2", "--device", "cuda",
                    "--ct2-cache", str(tmp_path / "c"))[3:])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --device cuda: CTranslate2 4.8.5 cannot load libcublas.so.12, CUDA 12's cuBLAS, which its wheels need "
        "whatever CUDA this machine has: " + CUBLAS_FIX]
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()
