"""Shared fixtures: a tiny slice of the real default corpus, prepared once per test session; and the rule that
the suite runs on the CPU on any machine, but for the GPU's own tests (``requires_cuda``)."""
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The suite runs one worker a core (scripts/test.sh), and each worker, with every process it starts, on one torch
# thread: a second thread beside another busy core slows a micro model several times, never speeds it up. Set
# before torch is first imported, so that this process takes it too.
os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def requires_cuda(test):
    """A test that needs a CUDA GPU: skipped where there is none, and the only kind of test that sees one."""
    import torch

    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


@pytest.fixture(scope="session", autouse=True)
def visible_gpus():
    """Tests run on the CPU, as CI does, even on a machine with a GPU: their expected bytes, ties and speeds are
    the CPU's, and a GPU's kernels need not give the same bytes twice. The processes a test starts, and its
    session's fixtures, see no GPU; the GPU's own tests (``requires_cuda``) see the machine's. Returns the
    machine's CUDA_VISIBLE_DEVICES (None: unset)."""
    machine = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    yield machine
    if machine is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = machine


@pytest.fixture(autouse=True)
def cpu_unless_a_gpu_test(request, monkeypatch, visible_gpus):
    """In this process too: torch says there is no GPU, except to a ``requires_cuda`` test, whose processes see
    the machine's GPUs again."""
    if request.node.get_closest_marker("gpu") is None:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    elif visible_gpus is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible_gpus)


@pytest.fixture(scope="session")
def tiny_en_de(tmp_path_factory):
    """Multi30k en-de with the first 203 training pairs (not a multiple of 8) (full valid/test), vocabulary 300, prepared by nat_kd."""
    from nat_kd.prepare import PrepareConfig, prepare

    return prepare(PrepareConfig("en", "de", vocab_size=300, train_limit=203),
                   out_dir=tmp_path_factory.mktemp("data") / "en-de")


def python_m(module: str, *args, cwd=ROOT) -> str:
    """``python -m module args`` in ``cwd``, as the study runs its jobs: forked from the job server, which
    imported fairseq once, so that a command starts in a second, not the several a fresh interpreter spends
    importing fairseq (tests/test_cli.py starts each entry point in a fresh one). It sees the environment of the
    server's start, not a test's monkeypatched one. Returns its combined output (stdout and stderr); a failure
    raises AssertionError with the output's end."""
    from nat_kd.engine.fairseq_jobs import run_logged

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "log"
        try:
            run_logged(module, list(args), log, threads=1, cwd=cwd)
        except RuntimeError as failed:
            raise AssertionError(f"python -m {module} failed: {failed}"
                                 f"\n{log.read_text(encoding='utf-8')[-4000:]}") from None
        return log.read_text(encoding="utf-8").split("\n", 1)[1]


def run_fairseq(tool: str, *args, cwd=ROOT) -> str:
    """fairseq_cli.<tool> (train, generate, ...), as ``python_m``: its combined output."""
    return python_m(f"fairseq_cli.{tool}", *args, cwd=cwd)


# Micro dimensions for any kd_* architecture: enough to train and decode in seconds.
MICRO_MODEL = ("--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
               "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2")


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not ended, not a zombie), from /proc."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False

VALID_LINES = 1014  # Multi30k's valid split, whole: a hand-made distilled set's real targets are the prepared corpus's


def write_distilled(tiny_en_de, out, bin_left_out=(), empty_outputs=False, targets=None, name="kd", split="valid"):
    """A distilled set of the tiny corpus's ``split`` written by the generator's own output code, with targets
    made by hand: every third line a reference said twice (a repeated n-gram), the others the reference's first
    three words (or, as from a teacher that ends every sentence at once, ``empty_outputs``; or
    ``targets(references)``). A training split's set carries the corpus's other splits in bin/, as the
    generator's does. Returns the references and the targets."""
    import sentencepiece
    from fairseq.data import Dictionary

    from nat_kd.analysis.metrics.sentence import SentenceScorer
    from nat_kd.distill.output import write_output
    from nat_kd.distill.source import load_binarized
    from nat_kd.hashing import sha256_file

    refs = (tiny_en_de / "raw" / f"{split}.de").read_text(encoding="utf-8").splitlines()
    sources = (tiny_en_de / "raw" / f"{split}.en").read_text(encoding="utf-8").splitlines()
    lines = len(refs)
    assert split != "valid" or lines == VALID_LINES
    targets = ([f"{r} {r}" if i % 3 == 0 else " ".join(r.split()[:3]) for i, r in enumerate(refs)]
               if targets is None else targets(refs))
    if empty_outputs:
        targets = [""] * lines
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tiny_en_de / "spm.model"))
    src_dict = Dictionary.load(str(tiny_en_de / "bin" / "dict.en.txt"))
    tokens = load_binarized(tiny_en_de / "bin", split, "en", "en-de", src_dict)
    pieces = [" ".join(p) for p in sp.encode(targets, out_type=str)]
    source_pieces = [" ".join(p) for p in sp.encode(sources, out_type=str)]
    scores = SentenceScorer().score(targets, refs, logprobs=[-0.1 * i for i in range(lines)])
    meta = {"name": name, "strategy": "beam", "split": split, "source_lang": "en", "target_lang": "de",
            "sentences": lines, "empty_source_lines": [], "truncated_source_lines": [], "teacher": {},
            "fingerprint": {"spm_model": sha256_file(tiny_en_de / "spm.model")},  # as the generator records it
            "files": {"source": f"{split}.en", "target": f"{split}.de",
                      "binarized_left_out_lines": list(bin_left_out)}}
    write_output(out, split=split, src="en", tgt="de", source_text=sources, source_tokens=tokens,
                 source_pieces=source_pieces, target_pieces=pieces, target_text=targets,
                 dict_dir=tiny_en_de / "bin", meta=meta, bin_left_out=bin_left_out, references=refs,
                 sentence_scores=scores, data_dir=tiny_en_de / "bin" if split == "train" else None)
    return refs, targets


# ------------------------------------------------------------------ fairseq's own commands on the tiny corpus

COMMON = ("--user-dir", ROOT / "fairseq_plugins", "--required-batch-size-multiple", "1", "--seed", "1",
          "--no-progress-bar", "--log-format", "simple", "--cpu")
TRAIN = ("--optimizer", "adam", "--lr", "5e-4", "--max-tokens", "1024", "--max-update", "3",
         "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0")
TRAIN_SENTENCES = 203  # the tiny slice: not a multiple of 8, so fairseq's default would lose some


def hypotheses(generate_output: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", generate_output, re.M)}


def train_and_decode(bin_dir: Path, save_dir: Path, arch: str, task_flags, decode_flags):
    log = run_fairseq("train", bin_dir, *COMMON, *TRAIN, "--arch", arch, *MICRO_MODEL, *task_flags,
                      "--save-dir", save_dir)
    assert "done training" in log
    out = run_fairseq("generate", bin_dir, *COMMON, *task_flags[:2], "--path", save_dir / "checkpoint_last.pt",
                      "--gen-subset", "train", "--max-tokens", "4096", "--max-len-a", "1", "--max-len-b", "5",
                      *decode_flags)
    return hypotheses(out)


# ------------------------------------------------------------------ the study's profiles in miniature

def small_multi30k(folder: Path, train: int = 120, evaluation: int = 100) -> str:
    """The first lines of each Multi30k split (all four languages): the end-to-end profiles decode the
    validation and test sets several times, and their size, not the models', sets the tests' time."""
    from nat_kd.corpus import data_dir, iter_lines

    folder.mkdir()
    for file in data_dir().iterdir():
        split, lang = file.name.split(".")[:2]
        if lang in ("en", "de", "fr", "cs"):
            lines = list(itertools.islice(iter_lines(file), train if split == "train" else evaluation))
            (folder / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(folder)


def run_profile(profile: str, tmp_path: Path, evaluation: int = 100, extra: tuple[str, ...] = ()):
    """Run a bundled profile end to end on the first Multi30k lines (``extra``: more of the driver's options);
    its folder, corpus, results folder, results.md, step records and config, after checking that every planned
    step has a record."""
    from nat_kd.study import config as study_config
    from nat_kd.study.__main__ import main
    from nat_kd.study.plan import build_plan

    out = tmp_path / profile
    corpus = small_multi30k(tmp_path / "multi30k", evaluation=evaluation)
    assert main([profile, "--out", str(out), "--data-dir", corpus, *extra]) == 0
    results = out / "results"
    steps = json.loads((results / "results.json").read_text())["steps"]
    cfg = study_config.load(profile)
    assert set(steps) == {s.name for s in build_plan(cfg, results)}
    return out, corpus, results, (results / "results.md").read_text(), steps, cfg

# ------------------------------------------------------------------ the generator's micro teacher and its input

N_LINES = 48
EMPTY_LINE = 5  # 1-based
LONG_LINE = 9  # longer than the teacher's 1024 source positions


def train_micro_teacher(tiny_en_de, save: Path, updates: int, seed: int) -> Path:
    """A micro AT teacher of the tiny corpus trained for ``updates`` updates from ``seed``; its checkpoint."""
    run_fairseq("train", tiny_en_de / "bin", "--user-dir", "fairseq_plugins", "--arch", "kd_transformer_tiny",
                *MICRO_MODEL, "--optimizer", "adam", "--lr", "5e-3", "--max-tokens", "2048", "--max-update", updates,
                "--criterion", "label_smoothed_cross_entropy", "--required-batch-size-multiple", "1",
                "--save-dir", save, "--no-epoch-checkpoints", "--save-interval", "1000", "--disable-validation",
                "--seed", seed, "--log-format", "none")
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def teacher(tiny_en_de, tmp_path_factory):
    """A micro AT teacher (60 updates) of the tiny corpus: the generator's tests decode with it."""
    return train_micro_teacher(tiny_en_de, tmp_path_factory.mktemp("teacher"), updates=60, seed=1)


@pytest.fixture(scope="session")
def other_teacher(tiny_en_de, tmp_path_factory):
    """Another micro teacher of the same corpus and dictionaries (seed 2, 30 updates): with ``teacher``, an
    ensemble of two different models, whose output neither model gives alone."""
    return train_micro_teacher(tiny_en_de, tmp_path_factory.mktemp("other_teacher"), updates=30, seed=2)


@pytest.fixture(scope="session")
def corpus(tiny_en_de, tmp_path_factory):
    """The first valid lines of the tiny corpus, with one empty source and one over-long source: the generator's
    tests' input."""
    d = tmp_path_factory.mktemp("corpus")
    src = (tiny_en_de / "raw" / "valid.en").read_text(encoding="utf-8").splitlines()[:N_LINES]
    ref = (tiny_en_de / "raw" / "valid.de").read_text(encoding="utf-8").splitlines()[:N_LINES]
    src[EMPTY_LINE - 1] = ""
    src[LONG_LINE - 1] = " ".join(["dog"] * 1100)
    (d / "src.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (d / "ref.de").write_text("".join(r + "\n" for r in ref), encoding="utf-8")
    return d


def config(teacher, tiny_en_de, corpus, out, **kw):
    """The generator's settings for a run of ``teacher`` over ``corpus`` into ``out``; ``kw``: decoding settings and
    DistillConfig's own."""
    from nat_kd.distill import DistillConfig
    from nat_kd.distill.decoding import DecodingSettings

    decoding = {k: kw.pop(k) for k in list(kw) if k in DecodingSettings.__dataclass_fields__}
    decoding.setdefault("max_len_b", 20)
    return DistillConfig(teachers=[str(teacher)], out_dir=str(out), spm_model=str(tiny_en_de / "spm.model"),
                         split="valid", source=str(corpus / "src.en"), reference=str(corpus / "ref.de"),
                         dict_dir=str(tiny_en_de / "bin"), decoding=DecodingSettings(**decoding),
                         workers=kw.pop("workers", 1), threads=1, progress_bar=False, **kw)


def kill_after_first_chunk_and_resume(command: list[str], out: Path) -> None:
    """Run the generator ``command`` (``python -m module ...``) in a fresh interpreter, as a user does, kill -9
    it once a chunk is saved (before the last), then run it again to the end in another process (``python_m``'s);
    checks the kill really fell mid-run and nothing half-written was left."""
    assert command[:2] == [sys.executable, "-m"], command[:2]
    partial = out.with_name(out.name + ".partial")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list(partial.glob("chunk-*.json")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = len(list(partial.glob("chunk-*.json")))
    n_chunks = len(json.loads((partial / "plan.json").read_text())["chunks"])
    assert 0 < saved < n_chunks and not out.exists()  # really killed mid-run, nothing half-written
    python_m(*command[2:])
    assert not partial.exists()


def output_bytes(out: Path) -> dict:
    """Every output file's bytes, and meta.json without its timing (meta.json and the card without the name)."""
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    meta = json.loads(files.pop("meta.json"))
    meta.pop("timing")
    meta.pop("name")  # the output folder's name
    meta["batching"].pop("num_shards")
    card = json.loads(files.pop("card.json"))
    card.pop("name")
    files["CARD.md"] = files["CARD.md"].split(b"\n", 1)[1]  # its title is the name
    return {**files, "meta": meta, "card": card}


def lines(path: Path) -> list[str]:
    """A text file's lines, an empty last one (after the final newline) left out."""
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def cli(teacher, tiny_en_de, corpus, out, *extra):
    """The generator's command line for the same run as ``config``'s."""
    return [sys.executable, "-m", "nat_kd.generate_distilled", "--teacher", str(teacher),
            "--source", str(corpus / "src.en"), "--reference", str(corpus / "ref.de"), "--split", "valid",
            "--spm-model", str(tiny_en_de / "spm.model"), "--dict-dir", str(tiny_en_de / "bin"),
            "--out", str(out), "--max-len-b", "20", "--workers", "1", "--threads", "1", "--no-progress-bar", *extra]


# ------------------------------------------------------------------ published teachers built here (Hugging Face)

def train_sentencepiece(texts: list[str], prefix, size: int, model_type: str = "unigram"):
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_prefix=str(prefix), vocab_size=size, model_type=model_type,
        character_coverage=1.0, bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, minloglevel=2)
    return sentencepiece.SentencePieceProcessor(model_file=f"{prefix}.model")


def tiny(config_class, vocab_size: int, positions: int = 512, **special):
    # wide initial weights: a random model whose outputs depend on its input (beams and samples then differ)
    return config_class(vocab_size=vocab_size, d_model=32, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_position_embeddings=positions, init_std=0.5, **special)


def marian_teacher(source: list[str], target: list[str], work, folder):
    """A random MarianMT folder as OPUS-MT ships one: a sentencepiece model per language (150 pieces) and one
    vocabulary of both; its files are written to ``folder``, the models' to ``work``."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    pieces = []
    for lang, text in (("src", source), ("tgt", target)):
        model = train_sentencepiece(text, work / f"sp_{lang}", 150)
        pieces += [model.id_to_piece(i) for i in range(model.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (work / "marian_vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    MarianTokenizer(source_spm=str(work / "sp_src.model"), target_spm=str(work / "sp_tgt.model"),
                    vocab=str(work / "marian_vocab.json"), model_max_length=512).save_pretrained(folder)
    pad = len(vocab) - 1
    MarianMTModel(tiny(MarianConfig, len(vocab), pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                       forced_eos_token_id=0)).save_pretrained(folder)
    return folder
