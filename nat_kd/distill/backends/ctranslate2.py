"""The CTranslate2 backend: the teacher converted once to CTranslate2 and decoded by its C++ engine.

Conversion (``converted_model``) goes through CTranslate2's own ``FairseqConverter``, into a cache folder
keyed by the content hash of the checkpoint, its dictionaries and the CTranslate2 version, written
atomically; every later run, worker and shard loads the cached copy. The converted model is float32;
``--compute-type`` (int8, float16, ...) is applied by CTranslate2 when it loads it.

The strategies map onto CTranslate2's decoding options: beam (``beam_size``, ``length_penalty``), greedy
(beam 1), seq-inter (``num_hypotheses`` = K of a beam of K), sampling/topk/topp (``sampling_topk`` 0 or k,
``sampling_topp``, ``sampling_temperature``). fairseq's length limit a * source length + b exists here only
for a = 0 (``max_decoding_length``).

Parallelism on the CPU: ``threads`` model replicas (CTranslate2's ``inter_threads``, one intra-op thread each)
decode sub-batches of at most ``CPU_SUB_BATCH_TOKENS`` source tokens, which CTranslate2 cuts from each batch of
the chunk plan (sorted by length, so the cut depends on the batch alone). ``submit`` queues a batch without
waiting, so the caller can queue the next chunk while this one finishes and no replica idles at a chunk's end.
On a GPU, and when sampling: one replica with ``threads`` intra-op threads, and the plan's batches as they are.

Sampling: CTranslate2 draws from one random generator per thread, seeded once, the first time that thread
samples, by ``set_random_seed`` (src/random.cc); it cannot be reseeded later. So each batch is decoded by a
fresh translator (a fresh thread) after setting the seed to a hash of (--seed, the batch's sentence ids):
a sentence's sample depends on the seed and on its batch, and batches are fixed by the chunk plan
(--max-tokens, --max-sentences), not by shards, workers or resumption. Unlike the fairseq backend's per-
sentence streams, another batch size gives other samples (docs/generate_distilled.md).
"""
from __future__ import annotations

import ctypes
import logging
import re
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

from nat_kd import atomic
from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file, sha256_json

from ..decoding import STRATEGIES, build_strategy
from ..source import token_strings
from ..teachers import PublishedTeacher
from .base import Backend, BackendInputs, BackendSettings, Decoded, Hypothesis

logger = logging.getLogger("nat_kd.generate_distilled")

SAMPLING_STRATEGIES = ("sampling", "topk", "topp")
REFUSED = "use --backend fairseq (the default), which decodes any fairseq model"
CPU_SUB_BATCH_TOKENS = 2048  # faster than whole 12000-token batches on 2 cores (docs/results/generator_speed.md)
# CTranslate2's error for a position past the model's table (layers/common.cc)
POSITIONS_ERROR = re.compile(r"No position encodings are defined for positions >= (\d+)")
# CTranslate2 4.x's Linux wheels carry CUDA 12's runtime (cudart, linked in) and load CUDA 12's cuBLAS with
# dlopen at the first matrix product (src/cuda/cublas_stub.cc); its CUDA errors are "CUDA failed with error
# " + cudaGetErrorString (src/cuda/utils.h). A CUDA 13 machine has libcublas.so.13 only.
CUBLAS_LIBRARY = "libcublas.so.12"
LIBRARY_ERROR = re.compile(r"Library (\S+) is not found or cannot be loaded"  # CTranslate2's dlopen stub
                           r"|(\S+\.so[.\d]*): cannot open shared object file")  # dlopen's own (ctypes)
CUDA_ERROR = re.compile(r"CUDA failed with error (.+)")
# pip's nvidia-cublas-cu12 (setup.cfg's extra cuda12-cublas) puts CUDA 12's cuBLAS in site-packages, where no
# loader looks. Loaded by path with RTLD_GLOBAL before ctranslate2, CTranslate2's dlopen("libcublas.so.12") then
# finds it by its soname. libcublas.so.12 needs libcublasLt.so.12, so that one goes first.
PIP_CUBLAS_LIBRARIES = ("libcublasLt.so.12", "libcublas.so.12")
CUBLAS_EXTRA = "cuda12-cublas"
_pip_cublas: list[str] | None = None  # what load_pip_cublas loaded in this process (None: not tried yet)


def pip_cublas_folder() -> Path | None:
    """The ``nvidia/cublas/lib`` folder of an installed nvidia-cublas-cu12 holding CUDA 12's cuBLAS, else None
    (not installed, or another CUDA's package in that place)."""
    try:
        import nvidia.cublas
    except ImportError:
        return None
    for folder in (Path(p) / "lib" for p in nvidia.cublas.__path__):
        if all((folder / name).is_file() for name in PIP_CUBLAS_LIBRARIES):
            return folder
    return None


def load_pip_cublas(device: str) -> list[str]:
    """On a GPU, load pip's CUDA 12 cuBLAS (if installed) so that CTranslate2 finds it; once per process. Returns
    the libraries' paths, in the order loaded (none where the package is absent or the device is the CPU)."""
    global _pip_cublas
    if device_and_index(device)[0] != "cuda" or not sys.platform.startswith("linux"):
        return []
    if _pip_cublas is None:
        folder = pip_cublas_folder()
        loaded = []
        for path in ([str(folder / name) for name in PIP_CUBLAS_LIBRARIES] if folder else []):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as err:
                pip = f"{shlex.quote(sys.executable)} -m pip"
                raise SettingsError(f"--device {device}: cannot load {path} of the installed nvidia-cublas-cu12 "
                                    f"({err}): reinstall it ({pip} install --force-reinstall nvidia-cublas-cu12), "
                                    "or use --backend fairseq") from None
            loaded.append(path)
        if loaded:
            logger.info("loaded CUDA 12's cuBLAS for CTranslate2 from %s (nvidia-cublas-cu12)", folder)
        _pip_cublas = loaded
    return _pip_cublas


def import_ctranslate2(device: str):
    """The ctranslate2 module, imported after pip's CUDA 12 cuBLAS was loaded where ``device`` is a GPU."""
    load_pip_cublas(device)
    import ctranslate2

    return ctranslate2


def check(settings: BackendSettings, teacher) -> None:
    """Refuse, before converting anything, what this backend cannot decode as the fairseq backend would."""
    ctranslate2 = import_ctranslate2(settings.device)
    if not isinstance(teacher, PublishedTeacher):  # a published teacher is a CTranslate2 model already
        check_fairseq_teacher(teacher)
    if settings.decoding.max_len_a != 0:
        raise SettingsError(f"--max-len-a {settings.decoding.max_len_a}: CTranslate2 limits outputs to a fixed length "
                            "(--max-len-b) only; use --max-len-a 0 or --backend fairseq")
    device, index = device_and_index(settings.device)
    with gpu_errors(settings.device):
        supported = sorted(ctranslate2.get_supported_compute_types(device, index))
        if device == "cuda" and sys.platform == "linux":  # CTranslate2 loads it only at the first translation
            ctypes.CDLL(CUBLAS_LIBRARY)
    if settings.compute_type not in supported:
        raise SettingsError(f"--compute-type {settings.compute_type}: this machine's {device} supports "
                            f"{', '.join(supported)}")


def gpu_error(err: BaseException, device: str) -> SettingsError | None:
    """CTranslate2's error (or dlopen's) when it cannot use the GPU: a CUDA library it cannot load, no GPU, no
    driver or one too old, as one line that names the fix; None for any other error."""
    import ctranslate2

    version = f"CTranslate2 {ctranslate2.__version__}"
    fairseq = "or use --backend fairseq (the default), which runs on the CUDA that the installed torch was built for"
    library, cuda = LIBRARY_ERROR.search(str(err)), CUDA_ERROR.search(str(err))
    if library:
        name = library.group(1) or library.group(2)
        return SettingsError(f"--device {device}: {version} cannot load {name}, CUDA 12's cuBLAS, which its wheels "
                             f"need whatever CUDA this machine has: install it {cublas_install()}, {fairseq}")
    if cuda is None:
        return None
    what = cuda.group(1).strip()
    count = ctranslate2.get_cuda_device_count()
    if "no CUDA-capable device" in what or ("invalid device ordinal" in what and count == 0):
        return SettingsError(f"--device {device}: {version} finds no CUDA GPU on this machine ({what}): use "
                             "--device cpu, or run where a GPU is")
    if "invalid device ordinal" in what:
        return SettingsError(f"--device {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1} "
                             f"({what})")
    if "driver version is insufficient" in what:
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:  # CUDA's runtime says the same when there is no driver at all
            return SettingsError(f"--device {device}: no NVIDIA driver on this machine (libcuda.so.1 cannot be "
                                 f"loaded; {version}: {what}): use --device cpu, or install the driver")
        return SettingsError(f"--device {device}: the NVIDIA driver is older than CUDA 12, which {version}'s "
                             f"wheels are built for ({what}): install a driver for CUDA 12 or later, {fairseq}")
    return None


def cublas_install() -> str:
    """How to install CUDA 12's cuBLAS where this backend loads it itself: setup.cfg's extra, with this Python's
    pip, from nat-kd's folder (its editable install, as scripts/bootstrap.sh makes it)."""
    return (f"with setup.cfg's extra: {shlex.quote(sys.executable)} -m pip install -e '.[{CUBLAS_EXTRA}]' in "
            "nat-kd's folder (pip's nvidia-cublas-cu12, which the backend then loads itself)")


@contextmanager
def gpu_errors(device: str):
    """CTranslate2's errors about the GPU (``gpu_error``) as a SettingsError; any other error as it is."""
    try:
        yield
    except (RuntimeError, OSError) as err:
        settings_error = gpu_error(err, device)
        if settings_error is None:
            raise
        raise settings_error from None


def check_fairseq_teacher(teacher) -> None:
    """A fairseq teacher that CTranslate2's FairseqConverter converts: one autoregressive transformer."""
    from fairseq.models.nat import FairseqNATModel
    from fairseq.models.transformer import TransformerModel

    if len(teacher.models) > 1:
        raise SettingsError(f"the ctranslate2 backend decodes one checkpoint, not an ensemble of "
                            f"{len(teacher.models)} ({', '.join(teacher.paths)}): {REFUSED}")
    model = teacher.models[0]
    if isinstance(model, FairseqNATModel) or not isinstance(model, TransformerModel):  # NAT models subclass it
        raise SettingsError(f"teacher {teacher.paths[0]} is a {type(model).__name__} ({teacher.archs[0]}), not an "
                            f"autoregressive transformer; CTranslate2 cannot convert it: {REFUSED}")
    if getattr(model.decoder, "adaptive_softmax", None) is not None:
        raise SettingsError(f"teacher {teacher.paths[0]} uses an adaptive softmax, which CTranslate2 cannot "
                            f"convert: {REFUSED}")


def model_dir(teacher, cache: Path) -> Path:
    """The teacher's CTranslate2 model folder: a published teacher's own (converted already if it came from
    Hugging Face), or a fairseq checkpoint converted on first use."""
    return teacher.model_dir if isinstance(teacher, PublishedTeacher) else converted_model(teacher, cache)


def converted_model(teacher, cache: Path) -> Path:
    """The teacher (a single-checkpoint TeacherEnsemble) in CTranslate2's format, converted on first use into
    ``cache``, keyed by content hash."""
    import ctranslate2
    from ctranslate2.converters import FairseqConverter

    import fairseq_plugins

    key = sha256_json({"teacher": sha256_file(teacher.paths[0]),
                       "dictionaries": [sha256_file(teacher.dict_dir / f"dict.{lang}.txt")
                                        for lang in (teacher.source_lang, teacher.target_lang)],
                       "ctranslate2": ctranslate2.__version__})

    def build(work: Path) -> None:
        logger.info("converting %s to CTranslate2 into %s", teacher.paths[0], Path(cache) / key[:32])
        converter = FairseqConverter(teacher.paths[0], str(teacher.dict_dir), source_lang=teacher.source_lang,
                                     target_lang=teacher.target_lang,
                                     user_dir=str(Path(fairseq_plugins.__file__).parent))
        try:
            converter.convert(str(work), force=True)
        except (ValueError, NotImplementedError, KeyError, AttributeError) as err:
            raise SettingsError(f"CTranslate2 {ctranslate2.__version__} cannot convert teacher "
                                f"{teacher.paths[0]}: {err}; {REFUSED}") from None
        atomic.write_json(work / "nat_kd_source.json", {"teacher": str(Path(teacher.paths[0]).resolve()),
                                                        "dictionaries": str(teacher.dict_dir), "key": key})

    return atomic.build_once(Path(cache) / key[:32], build)


def device_and_index(device: str) -> tuple[str, int]:
    """nat_kd's device name ("cpu", "cuda", "cuda:N") as CTranslate2's (device, device_index)."""
    name, _, index = device.partition(":")
    return name, int(index or 0)


def sub_batch_tokens(device: str, strategy: str) -> int:
    """CTranslate2's ``max_batch_size`` in source tokens (0: the batch as it is). Sampling keeps whole batches
    on one replica: a replica's random stream continues from batch to batch, so which replica takes which
    sub-batch would change the samples."""
    return CPU_SUB_BATCH_TOKENS if device == "cpu" and strategy not in SAMPLING_STRATEGIES else 0


def batch_seed(seed: int, ids: list[int]) -> int:
    """A 32-bit seed from --seed and the batch's sentence ids (a fixed batch gets a fixed seed)."""
    return int(sha256_json([seed, sorted(ids)])[:8], 16)


class CTranslate2Backend(Backend):
    name = "ctranslate2"
    strategies = tuple(STRATEGIES)  # each mapped onto CTranslate2's options (the module's doc)
    # one process, one model replica per core decoding sub-batches side by side: faster than processes on 2 cores
    # (docs/results/generator_speed.md)
    cpu_workers = 1
    takes_compute_type = True
    decodes_published_teachers = True
    converter = "ctranslate2.converters.FairseqConverter"

    def __init__(self, settings: BackendSettings, inputs: BackendInputs, threads: int = 1):
        ctranslate2 = import_ctranslate2(settings.device)
        strategy, teacher = build_strategy(settings.decoding), inputs.teacher
        self.threads, self.seed = threads, settings.decoding.seed
        self.src_dict = teacher.src_dict
        self.source_tokens = inputs.source_tokens
        check(settings, teacher)
        self.model_dir = model_dir(teacher, Path(settings.cache))
        published = isinstance(teacher, PublishedTeacher)
        # a published model reads its tokenizer's input, EOS included (the fairseq converter's adds it itself),
        # and starts decoding from its target prefix (a multilingual teacher's language token)
        self.source_suffix = [teacher.eos] if published and not teacher.ct2_config.get("add_source_eos") else []
        self.target_prefix = teacher.target_prefix if published else []
        self.device_name = settings.device
        self.device, self.device_index = device_and_index(settings.device)
        self.sub_batch_tokens = sub_batch_tokens(self.device, strategy.name)
        self.compute_type = settings.compute_type
        self.sampling = strategy.name in SAMPLING_STRATEGIES
        s = settings.decoding
        # fairseq's limit: b tokens, then EOS is forced; never past the decoder's positions
        self.max_length = min(s.max_len_b, teacher.max_positions[1] - 1)
        prefix = len(self.target_prefix)  # CTranslate2's lengths count the target prefix
        self.options = dict(beam_size=strategy.beam_size, length_penalty=s.lenpen,
                            max_decoding_length=self.max_length + prefix, min_decoding_length=1 + prefix,
                            max_input_length=0, return_scores=True,
                            num_hypotheses=strategy.beam_size if strategy.needs_reference else 1)
        if self.sampling:
            self.options.update(sampling_topk=strategy.top_k if strategy.top_k > 0 else 0,
                                sampling_topp=strategy.top_p if 0 < strategy.top_p < 1 else 1.0,
                                sampling_temperature=s.temperature)
            # the model's files, read once: each batch loads a fresh translator from memory (see the module doc)
            self.files = {p.name: p.read_bytes() for p in self.model_dir.iterdir() if p.is_file()}
            self.translator = None
        else:
            self.translator = self._translator()
        self._ctranslate2 = ctranslate2

    def _translator(self, files=None):
        import ctranslate2

        threads = ({"inter_threads": self.threads, "intra_threads": 1} if self.sub_batch_tokens
                   else {"inter_threads": 1, "intra_threads": self.threads})
        with gpu_errors(self.device_name):
            return ctranslate2.Translator(str(self.model_dir), device=self.device, device_index=self.device_index,
                                          compute_type=self.compute_type, files=files, **threads)

    @classmethod
    def check(cls, settings: BackendSettings, teacher) -> None:
        check(settings, teacher)  # the module's function

    @classmethod
    def prepare(cls, settings: BackendSettings, teacher) -> None:
        """Convert (or find) the teacher once, before the workers start and look for it."""
        model_dir(teacher, Path(settings.cache))

    @classmethod
    def set_up_process(cls, device: str) -> None:
        """Before a published teacher's folder imports ctranslate2 as it loads."""
        load_pip_cublas(device)

    @classmethod
    def converter_version(cls) -> str:
        import ctranslate2

        return ctranslate2.__version__

    @classmethod
    def describe(cls, settings: BackendSettings) -> dict:
        import ctranslate2

        strategy = settings.decoding.strategy
        return {"name": cls.name, "ctranslate2_version": ctranslate2.__version__,
                "compute_type": settings.compute_type,
                "sub_batch_tokens": sub_batch_tokens(device_and_index(settings.device)[0], strategy),
                **({"sampling_reproducible": "the same seed and batching (--max-tokens, --max-sentences) give the "
                    "same samples whatever the shards, workers or resumption; another batching gives other "
                    "samples, and they differ from the fairseq backend's"}
                   if strategy in SAMPLING_STRATEGIES else {})}

    def decode(self, ids: list[int]) -> Decoded:
        return self.submit(ids).result()

    def submit(self, ids: list[int]) -> "PendingBatch":
        """Queue one batch on the replicas and return at once; ``result()`` waits for it. Sampling batches are
        decoded before returning: each needs its own seeded translator (see the module doc)."""
        source = [line.split() + self.source_suffix
                  for line in token_strings(self.src_dict, [self.source_tokens[i] for i in ids])]
        options = dict(self.options, max_batch_size=self.sub_batch_tokens, batch_type="tokens",
                       target_prefix=[self.target_prefix] * len(ids) if self.target_prefix else None)
        if self.sampling:
            self._ctranslate2.set_random_seed(batch_seed(self.seed, ids))
            with self.position_limit():
                results = self._translator(self.files).translate_batch(source, **options)
        else:
            results = self.translator.translate_batch(source, asynchronous=True, **options)
        return PendingBatch(self, ids, results)

    @contextmanager
    def position_limit(self):
        """CTranslate2's error for a model with fewer positions than the teacher was taken to have (a
        CTranslate2 folder whose model.bin does not record them: teachers.DEFAULT_MAX_POSITIONS), as the
        setting that avoids it; and its errors about the GPU (``gpu_error``: the first translation is where
        CTranslate2 loads cuBLAS, should ``check``'s look have missed it)."""
        try:
            yield
        except RuntimeError as err:
            found = POSITIONS_ERROR.search(str(err))
            if found is None:
                gpu = gpu_error(err, self.device_name) if self.device != "cpu" else None
                if gpu is None:
                    raise
                raise gpu from None
            positions = int(found.group(1))
            raise SettingsError(f"teacher {self.model_dir} has {positions} positions (CTranslate2: {err}): pass "
                                f"--max-len-b {positions - 1 - len(self.target_prefix)} or less, and cut sources "
                                f"longer than {positions} tokens") from None

    def hypotheses(self, result) -> list[Hypothesis]:
        lenpen = self.options["length_penalty"]
        nbest, prefix = [], self.target_prefix
        for tokens, score in zip(result.hypotheses, result.scores):
            if prefix and tokens[:len(prefix)] == prefix:  # CTranslate2 returns the target prefix too
                tokens = tokens[len(prefix):]
            # Read as fairseq's score (the summed log-probability over length ** lenpen, the length counting
            # EOS, absent at the length limit) and brought to a per-token mean. It is not exactly fairseq's:
            # up to 0.003 higher on the micro teacher (docs/generate_distilled.md, "The logprob column")
            length = len(tokens) + (len(tokens) < self.max_length)
            nbest.append(Hypothesis(" ".join(tokens), score * length ** lenpen / length))
        return nbest


class PendingBatch:
    """A batch queued on CTranslate2's replicas (or already decoded, when sampling)."""

    def __init__(self, backend: CTranslate2Backend, ids: list[int], results):
        self.backend, self.ids, self.results = backend, ids, results

    def result(self) -> Decoded:
        with self.backend.position_limit():
            done = [r.result() if hasattr(r, "result") else r for r in self.results]
        return [(i, self.backend.hypotheses(r)) for i, r in zip(self.ids, done)]
