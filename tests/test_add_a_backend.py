"""A backend added from one file (docs/extending.md, "Add a backend"): the toy ``ReverseBackend`` below, registered
by the test, writes a distilled set through the library and the command line, in one process and in a pool of
two, without a change to the generator's files; its class attributes are the policy the run follows."""
import inspect
import json
import subprocess
import sys

import pytest

from conftest import MICRO_MODEL, ROOT, run_fairseq
from nat_kd.distill.backends import Backend, Hypothesis, register_backend
from nat_kd.distill.source import token_strings


class ReverseBackend(Backend):
    """A toy backend: each source sentence's tokens in reverse order, as its one hypothesis."""

    name = "reverse"
    cpu_workers = 3  # decoding processes on a CPU without --workers (None: one per core)

    def __init__(self, settings, inputs, threads=1):
        self.src_dict, self.source_tokens = inputs.teacher.src_dict, inputs.source_tokens

    def decode(self, ids):
        sources = token_strings(self.src_dict, [self.source_tokens[i] for i in ids])
        return [(i, [Hypothesis(" ".join(reversed(line.split())), -0.5 * len(line.split()))])
                for i, line in zip(ids, sources)]


@pytest.fixture
def reverse(monkeypatch):
    """ReverseBackend registered for one test (the registry as it was afterwards)."""
    from nat_kd.distill import backends

    monkeypatch.setattr(backends, "_BACKENDS", dict(backends._BACKENDS))
    register_backend(ReverseBackend)
    return ReverseBackend


@pytest.fixture(scope="module")
def teacher(tiny_en_de, tmp_path_factory):
    """A checkpoint for the teacher's dictionaries and tokenization: the reverse backend never runs its weights."""
    save = tmp_path_factory.mktemp("teacher")
    run_fairseq("train", tiny_en_de / "bin", "--user-dir", "fairseq_plugins", "--arch", "kd_transformer_tiny",
                *MICRO_MODEL, "--optimizer", "adam", "--lr", "5e-3", "--max-tokens", "2048", "--max-update", "1",
                "--criterion", "label_smoothed_cross_entropy", "--required-batch-size-multiple", "1",
                "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation", "--seed", "1",
                "--log-format", "none")
    return save / "checkpoint_last.pt"


def lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def test_the_docs_worked_example_is_this_backend():
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    assert inspect.getsource(ReverseBackend) in text
    assert "register_backend(ReverseBackend)" in text


@pytest.mark.slow
def test_a_registered_backend_writes_the_set_by_library_and_command_line(reverse, teacher, tiny_en_de, tmp_path):
    """The library in one process, the command line in two worker processes (spawned: they get the class by
    reference and register it): the same files, whose targets are the reversed sources."""
    import sentencepiece

    from nat_kd.artifacts import PreparedCorpus
    from nat_kd.distill import DistillConfig, distill
    from nat_kd.generate_distilled import main

    prepared = PreparedCorpus(tiny_en_de)
    batching = dict(max_sentences=20, chunk_sentences=50)  # several chunks: the pool of two gets work
    library = distill(DistillConfig(
        teachers=[str(teacher)], out_dir=str(tmp_path / "library"), name="reverse", split="train",
        data_dir=str(prepared.bin.root), source=str(prepared.raw("train", "en")),
        reference=str(prepared.raw("train", "de")), tokenization=prepared.tokenization(), backend="reverse",
        workers=1, progress_bar=False, **batching))
    out = tmp_path / "command_line"
    assert main(["--teacher-path", str(teacher), "--prepared", str(tiny_en_de), "--split", "train", "--backend",
                 "reverse", "--workers", "2", "--max-sentences", "20", "--chunk-sentences", "50", "--name", "reverse",
                 "--out", str(out), "--no-progress-bar"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["backend"] == {"name": "reverse"} and meta["timing"]["workers"] == 2
    # it carries out no strategy: none recorded, nor the beam search's settings it never used
    assert meta["strategy"] is None and meta["settings"] == {}
    assert ("Backend `reverse`, which decodes its own way: no strategy, no decoding settings.\n"
            in (out / "CARD.md").read_text())
    assert meta["batching"]["chunks"] >= 3
    assert meta["teacher"]["converter"] is None
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(library.out_dir) for p in library.out_dir.rglob("*") if p.is_file())
    for name in files:
        if name.name != "meta.json":
            assert (out / name).read_bytes() == (library.out_dir / name).read_bytes(), name
    meta.pop("timing"), library.meta.pop("timing")
    assert meta == library.meta
    # the reference: sentencepiece's own pieces of each source, reversed, and its own decoding of them
    spm = sentencepiece.SentencePieceProcessor(model_file=str(tiny_en_de / "spm.model"))
    sources = lines(prepared.raw("train", "en"))
    pieces = [spm.encode(line, out_type=str)[::-1] for line in sources]
    assert len(sources) == 203
    assert lines(out / "spm" / "train.de") == [" ".join(p) for p in pieces]
    # fairseq's sentencepiece decoding (fairseq-generate's D- lines) strips the ends, sentencepiece's does not
    assert lines(out / "train.de") == [spm.decode_pieces(p).strip() for p in pieces]
    header, *rows = [row.split("\t") for row in lines(out / "scores.tsv")]
    assert [float(row[header.index("logprob")]) for row in rows] == [-0.5 * len(p) for p in pieces]


def test_the_run_follows_the_backends_policy(reverse, monkeypatch):
    """What the backend's class attributes say: its default processes on a CPU, and the precision options it does
    not take refused, naming the backends that take them."""
    from nat_kd.distill import DistillConfig, pool
    from nat_kd.errors import SettingsError

    def cfg(**kw):
        return DistillConfig(teachers=["teacher.pt"], out_dir="out", backend="reverse", **kw)

    monkeypatch.setattr(pool, "available_cores", lambda: 16)
    assert pool.parallelism(cfg(), "cpu") == (3, 5)  # cpu_workers = 3, the 16 cores shared
    assert pool.parallelism(cfg(workers=4), "cpu") == (4, 4)
    with pytest.raises(SettingsError, match=r"^--fp16 is for the fairseq backend$"):
        cfg(fp16=True).check()
    with pytest.raises(SettingsError, match=r"^--compute-type int8 is for --backend ctranslate2$"):
        cfg(compute_type="int8").check()
    with pytest.raises(SettingsError, match=r"^--max-tokens auto sizes the fairseq backend's beam search"):
        cfg(max_tokens="auto").check()
    cfg(check_against_fairseq=10).check()  # a backend that is not the reference may be checked against it


def test_a_backend_carries_out_the_strategies_it_declares(reverse):
    """A backend that carries out no strategy takes no decoding settings but the defaults; one that carries out
    some refuses the others, naming the backends that carry them out."""
    from nat_kd.distill import DistillConfig
    from nat_kd.distill.decoding import DecodingSettings
    from nat_kd.errors import SettingsError

    class BeamOnly(ReverseBackend):
        name = "beam-only"
        strategies = ("beam", "greedy")

    register_backend(BeamOnly)

    def check(backend, **decoding):
        DistillConfig(teachers=["teacher.pt"], out_dir="out", backend=backend,
                      decoding=DecodingSettings(**decoding)).check()

    check("reverse")  # a plain run
    with pytest.raises(SettingsError, match=r"^--strategy: the reverse backend decodes its own way, without a "
                                            r"strategy or decoding settings; drop it$"):
        check("reverse", strategy="topk")
    with pytest.raises(SettingsError, match=r"^--strategy, --top-k: the reverse backend .*; drop them$"):
        check("reverse", strategy="topk", top_k=20)
    with pytest.raises(SettingsError, match=r"^--beam: the reverse backend"):
        check("reverse", beam=4)
    check("beam-only", strategy="greedy", beam=4)
    # the built-in backends first, in the registry's order: a backend registered after them may carry it out too
    with pytest.raises(SettingsError, match=r"^--strategy sampling: the beam-only backend carries out beam, greedy; "
                                            r"sampling is for --backend fairseq or ctranslate2"):
        check("beam-only", strategy="sampling")


def test_the_registry_refuses_a_taken_name_and_names_the_known_ones(reverse):
    from nat_kd.distill.backends import backend_class, backend_names
    from nat_kd.errors import SettingsError

    # the built-in backends, and this one after them: others may be registered too
    names = backend_names()
    assert names[:2] == ["fairseq", "ctranslate2"] and names[-1] == "reverse"
    assert backend_class("reverse") is ReverseBackend
    register_backend(ReverseBackend)  # the same class again: nothing changes
    class Impostor(ReverseBackend):
        name = "fairseq"

    with pytest.raises(ValueError, match=r"^backend 'fairseq' is nat_kd.distill.backends.fairseq:FairseqBackend "
                                         r"already, not test_add_a_backend:test_the_registry_refuses_a_taken_name_"
                                         r"and_names_the_known_ones.<locals>.Impostor$"):
        register_backend(Impostor)
    assert backend_class("fairseq").__name__ == "FairseqBackend"
    with pytest.raises(SettingsError, match=r"^unknown backend 'nope': choose one of fairseq, ctranslate2, .*reverse$"):
        backend_class("nope")


IMPORTS = """
import sys
import nat_kd.distill, nat_kd.distill.pipeline, nat_kd.distill.__main__
from nat_kd.distill import DistillConfig
from nat_kd.distill.backends import backend_class
nat_kd.distill.__main__.build_parser([])
DistillConfig(teachers=["t.pt"], out_dir="o", backend="ctranslate2").check()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("ctranslate2", "transformers"))
assert loaded == [], loaded
assert backend_class("ctranslate2").name == "ctranslate2"
assert "nat_kd.distill.backends.ctranslate2" in sys.modules and "ctranslate2" not in sys.modules
print("ok")
"""


@pytest.mark.slow
def test_the_registry_imports_no_engine_until_a_run_decodes():
    """The package, the pipeline, the command line's parser and a ctranslate2 run's settings check import neither
    ctranslate2 nor transformers; the ctranslate2 backend's class is imported without its engine."""
    proc = subprocess.run([sys.executable, "-c", IMPORTS], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "ok", proc.stdout[-3000:]
