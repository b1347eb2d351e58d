"""The study's configuration: a TOML file (see profiles/*.toml) read into dataclasses, checked up front.

Every section has defaults, so a config names only what it changes; unknown keys are errors (a typo would
otherwise silently run the default). ``profile_path`` resolves a bundled profile's name (``profile_names``).
"""
from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from nat_kd.errors import NatKdError
from nat_kd.launch.settings import ClusterConfig, cluster_config

PROFILES = Path(__file__).parent / "profiles"
# [analysis]: the detailed measures of nat_kd.analysis.report.DetailedAnalysisReport (off unless detailed = true)
ANALYSIS_DEFAULTS = {"detailed": False,
                     "buckets": [1, 2, 5, 20, 100],  # lower edges of the source-frequency buckets of C(d)
                     "floors": [1e-9, 1e-6, 1e-3],  # F(d) at each smoothing floor
                     "interpolation": 0.1,  # lambda of the interpolated F(d)
                     "repeat_n": [2, 3]}  # share of outputs in which some n-gram occurs twice, for each n


class ConfigError(NatKdError):
    """A problem in the config file; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class ModelShape:
    """Transformer dimensions (encoder and decoder alike), given to fairseq on the command line."""
    embed_dim: int
    ffn_dim: int
    layers: int
    heads: int
    dropout: float = 0.1

    def flags(self) -> list[str]:
        """The same dimensions as fairseq-train options (--encoder-embed-dim 256 ...)."""
        return [str(x) for key, value in self.overrides().items() for x in (f"--{key.replace('_', '-')}", value)]

    def overrides(self) -> dict:
        """The same dimensions as fairseq argument names (to build the model in-process, e.g. to count it)."""
        out = {"dropout": self.dropout}
        for side in ("encoder", "decoder"):
            out |= {f"{side}_embed_dim": self.embed_dim, f"{side}_ffn_embed_dim": self.ffn_dim,
                    f"{side}_layers": self.layers, f"{side}_attention_heads": self.heads}
        return out

    @property
    def label(self) -> str:
        return f"{self.layers}x{self.embed_dim}"

    @classmethod
    def parse(cls, label: str) -> ModelShape:
        """'6x512' -> 6 layers of width 512, a feed-forward 4x as wide, a head every 64 dimensions (4 at most
        below 256: the studies' 2x128 students have 4), as transformer-base and the studies size them."""
        try:
            layers, width = (int(x) for x in label.split("x"))
        except ValueError:
            raise ValueError(f"{label}: write LAYERSxWIDTH, e.g. 2x128 or 6x512") from None
        heads = max(4, width // 64)
        if layers < 1 or width < 4 or width % heads:
            raise ValueError(f"{label}: at least 1 layer, and a width that its {heads} heads divide")
        return cls(embed_dim=width, ffn_dim=4 * width, layers=layers, heads=heads)


@dataclass(frozen=True)
class Training:
    """How one kind of model is trained: fairseq-train's budget and optimiser settings."""
    updates: int
    max_tokens: int = 4096
    lr: float = 1e-3
    warmup: int = 100
    label_smoothing: float = 0.1  # students whose loss has none get 0 (used_by)
    validate_every: int = 0  # updates between validations (0: every epoch)
    weight_decay: float = 0.0
    # Validation BLEU every N updates (0: never): the learning curve, and the checkpoint kept is the one with
    # the best validation BLEU instead of fairseq's best validation loss (see curve.py).
    bleu_every: int = 0
    patience: int = 0  # stop after this many BLEU measurements without a new best (0: train all updates)
    # glancing students (GLAT, CTC with glancing, DA-Transformer): the updates over which the glancing ratio
    # anneals from its start to its end (0: the plugin's default, fairseq recipes' 200k updates)
    glance_anneal_updates: int = 0

    def used_by(self, nat_family: str | None) -> Training:
        """These settings as a model of ``nat_family`` (None: an AT teacher) trains with them: label smoothing 0
        for a student whose loss has none, no glancing schedule for one that does not glance. A step's fingerprint
        is made of these, so a setting the model never reads retrains nothing when it changes."""
        if nat_family is None:
            return self
        from fairseq_plugins.models.nat import STUDENT_FAMILIES

        family = STUDENT_FAMILIES[nat_family]
        return replace(self, label_smoothing=self.label_smoothing if family.label_smoothing else 0.0,
                       glance_anneal_updates=self.glance_anneal_updates if family.glancing else 0)


@dataclass(frozen=True)
class TeacherSpec:
    name: str
    shape: ModelShape
    training: Training  # [teachers.training], with the keys of its own [teachers.models.training] over it


@dataclass(frozen=True)
class DistillSpec:
    teacher: str
    strategy: str

    @property
    def name(self) -> str:
        return f"{self.teacher}.{self.strategy}"


@dataclass(frozen=True)
class MixSpec:
    """[[mixes]]: a training set made by nat_kd.mix from a distilled set (its name is the set's label)."""
    name: str
    of: str  # the distilled set it mixes, by its label (TEACHER.STRATEGY)
    rule: dict  # nat_kd.mix.MixRule fields


@dataclass(frozen=True)
class SpeedSpec:
    """[speed]: test-set decoding speed on one thread, the teacher against NAT students (the reason NAT exists).
    Each system decodes the test set with each batching, ``repeats`` times, the systems taking turns
    (``plan._turns``)."""
    teacher: str
    teacher_strategies: tuple[str, ...]  # "beam" (the [evaluation] beam) and/or "greedy"
    students: tuple[str, ...]  # families, each the student trained on ``data``
    data: str  # a training set's label ("real", TEACHER.STRATEGY or a mix's name)
    batchings: tuple[str, ...]  # "sentences:N" (fairseq's --batch-size N) or "tokens:N" (--max-tokens N)
    repeats: int


@dataclass(frozen=True)
class TrainingSpeedSpec:
    """[training_speed]: fairseq-train's updates a second for each student family, from scratch on one training
    set with [students.training]'s batches, one thread; ``repeats`` rounds, the families taking turns."""
    families: tuple[str, ...]  # the first is the baseline of the ratios
    data: str  # a training set's label
    updates: int  # per run; fairseq logs its speed every 10 updates, and the first 10 (start-up) are left out
    repeats: int


@dataclass(frozen=True)
class StudyConfig:
    name: str
    src: str
    tgt: str
    vocab_size: int
    train_limit: int | None  # first N training pairs (None: all)
    jobs: int  # steps run at once, one torch thread each
    teachers: tuple[TeacherSpec, ...]  # in increasing capacity
    teacher_training: Training
    distilled: tuple[DistillSpec, ...]
    decoding: dict  # beam, top_k, temperature, ... (nat_kd.distill.decoding.DecodingSettings fields)
    distill_max_tokens: int
    student_families: tuple[str, ...]
    student_shape: ModelShape
    student_training: Training
    evaluation: dict  # beam, max_tokens
    analysis: dict  # detailed (bool) and the detailed measures' settings (see ANALYSIS_DEFAULTS)
    born_again_rounds: int
    born_again_student: str
    born_again_shape: ModelShape
    modes: dict | None  # the multi-modality experiment (None: skipped)
    source: Path | None = None
    # [corpus]: your own corpus instead of Multi30k (None): {"prepared": DIR} (nat_kd.prepare output) or
    # nat_kd.prepare's own-corpus settings {"trainpref": ..., "validpref": ..., "testpref": ..., "bpe_codes": ...}
    corpus: dict | None = None
    mixes: tuple[MixSpec, ...] = ()
    # more seeds of the student families on some training sets: the seed-to-seed spread beside every gap;
    # seed_sets: family -> the training sets its extra seeds train on
    student_seeds: tuple[int, ...] = ()
    seed_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    speed: SpeedSpec | None = None
    training_speed: TrainingSpeedSpec | None = None

    def data_labels(self) -> list[str]:
        """Every training set's label, in plan order: the real data, the distilled sets, the mixes."""
        return ["real"] + [d.name for d in self.distilled] + [m.name for m in self.mixes]
    # [launcher] and [resources.*]: the steps as cluster jobs (nat_kd.study.cluster; docs/study.md, "On a cluster")
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def profile_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = PROFILES / f"{name_or_path}.toml"
    if bundled.is_file():
        return bundled
    raise ConfigError(f"{name_or_path}: no such config file or bundled profile (profiles: "
                      f"{', '.join(profile_names())})")


def profile_names() -> list[str]:
    """The bundled profiles (nat_kd/study/profiles/NAME.toml), by name."""
    return sorted(p.stem for p in PROFILES.glob("*.toml"))


def _take(table: dict, key: str, default, where: str, kind=None):
    value = table.pop(key, default)
    if value is MISSING:
        raise ConfigError(f"{where}: missing key '{key}'")
    if kind is not None and value is not None and not isinstance(value, kind):
        raise ConfigError(f"{where}.{key} = {value!r}: expected {getattr(kind, '__name__', kind)}")
    return value


def _no_leftovers(table: dict, where: str) -> None:
    if table:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(table))}; check the spelling against "
                          "nat_kd/study/profiles/cpu.toml")


def _dataclass(cls, table: dict, where: str, **fixed):
    table = dict(table)
    values = dict(fixed)
    for f in fields(cls):
        if f.name in fixed:
            continue
        default = f.default if f.default is not MISSING else MISSING
        values[f.name] = _take(table, f.name, default, where)
    _no_leftovers(table, where)
    return cls(**values)


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: {err}") from None


def load(path: str | Path, corpus: str | Path | None = None) -> StudyConfig:
    """The config (a bundled profile's name or a TOML file); ``corpus``: a TOML file whose [corpus] section
    (and [study] src, tgt) replace the config's, to run a profile on your own corpus."""
    path = profile_path(str(path))
    raw = _read_toml(path)
    if corpus is not None:
        corpus = Path(corpus)
        overlay = _read_toml(corpus)
        study = overlay.pop("study", {})
        if set(overlay) - {"corpus"} or set(study) - {"src", "tgt"}:
            raise ConfigError(f"{corpus}: a corpus file holds [corpus] and [study] src, tgt only; other settings go "
                              "in the config")
        raw["study"] = {**raw.get("study", {}), **study}
        raw["corpus"] = {**overlay.get("corpus", {}), "_base": str(corpus.resolve().parent)}
    elif "corpus" in raw:
        raw["corpus"] = {**raw["corpus"], "_base": str(path.resolve().parent)}
    cluster = cluster_config({k: raw.pop(k) for k in ("launcher", "resources") if k in raw}, str(path))
    try:
        return replace(_build(raw, path), cluster=cluster)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    except TypeError as err:
        raise ConfigError(f"{path}: {err}") from None


def _build(raw: dict, path: Path) -> StudyConfig:
    study = dict(raw.pop("study", {}))
    where = "[study]"
    name = _take(study, "name", path.stem, where, str)
    src, tgt = _take(study, "src", "en", where, str), _take(study, "tgt", "de", where, str)
    vocab_size = _take(study, "vocab_size", 8000, where, int)
    train_limit = _take(study, "train_limit", 0, where, int) or None
    jobs = _take(study, "jobs", 2, where, int)
    _no_leftovers(study, where)

    teacher_section = dict(raw.pop("teachers", {}))
    shapes = teacher_section.pop("models", None)
    if not shapes:
        raise ConfigError("[teachers]: give [[teachers.models]] entries (name, embed_dim, ffn_dim, layers, heads), "
                          "smallest first")
    teacher_defaults = dict(teacher_section.pop("training", {}))
    teacher_training = _dataclass(Training, teacher_defaults, "[teachers.training]")
    teachers = []
    for entry in shapes:
        entry = dict(entry)
        teacher = str(_take(entry, "name", MISSING, "[[teachers.models]]"))
        own = entry.pop("training", {})
        training = _dataclass(Training, teacher_defaults | own, f"[[teachers.models]] {teacher}: training")
        teachers.append(TeacherSpec(teacher, _dataclass(ModelShape, entry, f"[[teachers.models]] {teacher}"), training))
    teachers = tuple(teachers)
    if len({t.name for t in teachers}) != len(teachers):
        raise ConfigError("[[teachers.models]]: teacher names must differ")
    _no_leftovers(teacher_section, "[teachers]")

    distill = dict(raw.pop("distill", {}))
    where = "[distill]"
    beam_teachers = _take(distill, "beam_teachers", [t.name for t in teachers], where, list)
    methods_teacher = _take(distill, "methods_teacher", teachers[len(teachers) // 2].name, where, str)
    methods = _take(distill, "methods", ["greedy", "topk", "sampling", "seq-inter"], where, list)
    max_tokens = _take(distill, "max_tokens", 3000, where, int)
    decoding = distill  # what is left: DecodingSettings fields (beam, top_k, temperature, seed, ...)
    from nat_kd.distill.decoding import STRATEGIES, DecodingSettings
    known = {f.name for f in fields(DecodingSettings)} - {"strategy"}  # the strategy is the set's own
    if set(decoding) - known:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(set(decoding) - known))}; decoding keys are "
                          f"{', '.join(sorted(known))}")
    for teacher in [*beam_teachers, methods_teacher]:
        if teacher not in {t.name for t in teachers}:
            raise ConfigError(f"{where}: teacher '{teacher}' is not one of [[teachers.models]] "
                              f"({', '.join(t.name for t in teachers)})")
    for method in methods:
        if method not in STRATEGIES:
            raise ConfigError(f"{where}.methods: unknown strategy '{method}'; choose from {', '.join(STRATEGIES)}")
    distilled = tuple([DistillSpec(t, "beam") for t in beam_teachers]
                      + [DistillSpec(methods_teacher, m) for m in methods if m != "beam"])

    students = dict(raw.pop("students", {}))
    where = "[students]"
    families = tuple(_take(students, "families", ["nat", "cmlm"], where, list))
    _check_families(families, f"{where}.families")
    student_shape = _dataclass(ModelShape, students.pop("model", {}), "[students.model]")
    student_training = _dataclass(Training, students.pop("training", {}), "[students.training]")
    seeds = tuple(_take(students, "seeds", [], where, list))  # beyond seed 1, which every student trains with
    seed_sets = _take(students, "seed_sets", [], where, (list, dict))
    _no_leftovers(students, where)
    if any(not isinstance(x, int) or x == 1 for x in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}.seeds = {list(seeds)}: give distinct integers other than 1 (every student "
                          "trains with seed 1 already)")
    if bool(seeds) != bool(seed_sets):
        raise ConfigError(f"{where}: seeds and seed_sets go together (which seeds, on which training sets)")
    mixes = _mixes(raw.pop("mixes", []), {d.name for d in distilled})
    labels = ["real"] + [d.name for d in distilled] + [m.name for m in mixes]
    seed_sets = _seed_sets(seed_sets, families, labels, f"{where}.seed_sets")
    speed = _speed(raw.pop("speed", None), teachers, labels)
    training_speed = _training_speed(raw.pop("training_speed", None), labels)

    section, where = dict(raw.pop("evaluation", {})), "[evaluation]"
    evaluation = {"beam": _take(section, "beam", 5, where, int),
                  "max_tokens": _take(section, "max_tokens", 8192, where, int),
                  # AT output length limit a * source length + b (fairseq's defaults; NATs predict theirs)
                  "max_len_a": _take(section, "max_len_a", 0.0, where, (int, float)),
                  "max_len_b": _take(section, "max_len_b", 200, where, int),
                  # valid BLEU is informative only (checkpoints are chosen on valid loss); test is reported
                  "splits": _take(section, "splits", ["valid", "test"], where, list)}
    if "test" not in evaluation["splits"]:
        raise ConfigError(f"{where}.splits: must include 'test' (the reported figure)")
    _no_leftovers(section, where)
    for training, where in [(teacher_training, "[teachers.training]"), (student_training, "[students.training]"),
                            *[(t.training, f"[[teachers.models]] {t.name}") for t in teachers]]:
        if training.patience and not training.bleu_every:
            raise ConfigError(f"{where}: patience = {training.patience} needs bleu_every > 0 (patience counts "
                              "validation BLEU measurements)")
        if training.glance_anneal_updates and training is not student_training:
            raise ConfigError(f"{where}: glance_anneal_updates is for glancing students: move it to "
                              "[students.training]")

    section, where = dict(raw.pop("analysis", {})), "[analysis]"
    analysis = {key: _take(section, key, default, where, type(default) if key != "interpolation" else (int, float))
                for key, default in ANALYSIS_DEFAULTS.items()}
    if not 0 < analysis["interpolation"] < 1:
        raise ConfigError(f"{where}.interpolation = {analysis['interpolation']}: must be in (0, 1)")
    _no_leftovers(section, where)

    born = dict(raw.pop("born_again", {}))
    where = "[born_again]"
    rounds = _take(born, "rounds", 0, where, int)
    born_student = _take(born, "student", families[0], where, str)
    if born_student not in families:
        raise ConfigError(f"{where}.student: '{born_student}' is not one of [students].families")
    born_shape = _dataclass(ModelShape, born.pop("model", {}), "[born_again.model]") if rounds else student_shape
    _no_leftovers(born, where)

    corpus = _corpus(raw.pop("corpus", None))
    modes = raw.pop("modes", None)
    if corpus is not None:
        modes = None  # the multi-modality experiment needs Multi30k's four languages
    if modes is not None:
        section, where = dict(modes), "[modes]"
        modes = {"train_limit": _take(section, "train_limit", 0, where, int) or None,
                 "vocab_size": _take(section, "vocab_size", vocab_size, where, int),
                 "at": _dataclass(ModelShape, section.pop("at_model", {}), "[modes.at_model]"),
                 "nat": _dataclass(ModelShape, section.pop("nat_model", {}), "[modes.nat_model]"),
                 "training": _dataclass(Training, section.pop("training", {}), "[modes.training]")}
        _no_leftovers(section, where)
    _no_leftovers(raw, "top level")
    return StudyConfig(name, src, tgt, vocab_size, train_limit, jobs, teachers, teacher_training, distilled,
                       decoding, max_tokens, families, student_shape, student_training, evaluation, analysis, rounds,
                       born_student, born_shape, modes, path, corpus, mixes, seeds, seed_sets, speed,
                       training_speed)


def _mixes(entries: list, distilled: set[str]) -> tuple[MixSpec, ...]:
    """[[mixes]]: name, of (a distilled set's label) and the nat_kd.mix rule's keys."""
    from nat_kd.mix import MixRule

    rule_keys = {f.name for f in fields(MixRule)}
    out = []
    for entry in entries:
        entry, where = dict(entry), "[[mixes]]"
        name = _take(entry, "name", MISSING, where, str)
        of = _take(entry, "of", MISSING, f"{where} {name}", str)
        if of not in distilled:
            raise ConfigError(f"{where} {name}: of = '{of}' is not a distilled set ({', '.join(sorted(distilled))})")
        unknown = set(entry) - rule_keys
        if unknown:
            raise ConfigError(f"{where} {name}: unknown key(s) {', '.join(sorted(unknown))}; a mix takes name, of "
                              f"and the rule's keys ({', '.join(sorted(rule_keys))})")
        try:
            MixRule(**entry).validate()
        except NatKdError as err:
            raise ConfigError(f"{where} {name}: {err}") from None
        out.append(MixSpec(name, of, entry))
    names = [m.name for m in out]
    if len(set(names)) != len(names) or set(names) & (distilled | {"real"}):
        raise ConfigError("[[mixes]]: names must differ from each other, from 'real' and from the distilled sets")
    return tuple(out)


def _seed_sets(value: list | dict, families: tuple[str, ...], labels: list[str], where: str) -> dict:
    """seed_sets: a list of training sets (every family's extra seeds train on them), or a table naming, for
    some families, each one's own (the sets that seed 1 ranked best differ between families)."""
    by_family = {f: value for f in families} if isinstance(value, list) else dict(value)
    for family, sets in by_family.items():
        if family not in families:
            raise ConfigError(f"{where}.{family}: not one of [students].families ({', '.join(families)})")
        if not isinstance(sets, list):
            raise ConfigError(f"{where}.{family} = {sets!r}: expected a list of training sets")
        for label in sets:
            _check_label(label, labels, f"{where}.{family}")
    return {f: tuple(sets) for f, sets in by_family.items() if sets}


def _check_families(families, where: str) -> None:
    from fairseq_plugins.models.nat import STUDENT_FAMILIES

    for family in families:
        if family not in STUDENT_FAMILIES:
            raise ConfigError(f"{where}: unknown '{family}'; choose from {', '.join(STUDENT_FAMILIES)}")


def _check_label(label: str, labels: list[str], where: str) -> None:
    if label not in labels:
        raise ConfigError(f"{where}: '{label}' is not a training set ({', '.join(labels)})")


def _speed(section: dict | None, teachers: tuple[TeacherSpec, ...], labels: list[str]) -> SpeedSpec | None:
    if section is None:
        return None
    section, where = dict(section), "[speed]"
    teacher = _take(section, "teacher", teachers[-1].name, where, str)
    strategies = tuple(_take(section, "teacher_strategies", ["beam", "greedy"], where, list))
    students = tuple(_take(section, "students", ["nat"], where, list))
    data = _take(section, "data", MISSING, where, str)
    batchings = tuple(_take(section, "batchings", ["sentences:1", "tokens:4096"], where, list))
    repeats = _take(section, "repeats", 3, where, int)
    _no_leftovers(section, where)
    if teacher not in {t.name for t in teachers}:
        raise ConfigError(f"{where}.teacher: '{teacher}' is not one of [[teachers.models]]")
    if set(strategies) - {"beam", "greedy"} or not strategies:
        raise ConfigError(f"{where}.teacher_strategies = {list(strategies)}: choose from 'beam', 'greedy'")
    _check_families(students, f"{where}.students")
    _check_label(data, labels, f"{where}.data")
    for batching in batchings:
        kind, _, size = str(batching).partition(":")
        if kind not in ("sentences", "tokens") or not size.isdigit() or int(size) < 1:
            raise ConfigError(f"{where}.batchings: '{batching}' is not 'sentences:N' or 'tokens:N'")
    if repeats < 1:
        raise ConfigError(f"{where}.repeats = {repeats}: at least 1")
    return SpeedSpec(teacher, strategies, students, data, batchings, repeats)


TRAINING_SPEED_INTERVAL = 10  # fairseq-train's --log-interval in a training-speed run


def _training_speed(section: dict | None, labels: list[str]) -> TrainingSpeedSpec | None:
    if section is None:
        return None
    section, where = dict(section), "[training_speed]"
    families = tuple(_take(section, "families", MISSING, where, list))
    data = _take(section, "data", MISSING, where, str)
    updates = _take(section, "updates", 100, where, int)
    repeats = _take(section, "repeats", 3, where, int)
    _no_leftovers(section, where)
    if not families or len(set(families)) != len(families):
        raise ConfigError(f"{where}.families = {list(families)}: name each student family once")
    _check_families(families, f"{where}.families")
    _check_label(data, labels, f"{where}.data")
    if updates < 2 * TRAINING_SPEED_INTERVAL:
        raise ConfigError(f"{where}.updates = {updates}: at least {2 * TRAINING_SPEED_INTERVAL} (fairseq reports "
                          f"its speed every {TRAINING_SPEED_INTERVAL} updates and the first report is start-up)")
    if repeats < 1:
        raise ConfigError(f"{where}.repeats = {repeats}: at least 1")
    return TrainingSpeedSpec(families, data, updates, repeats)


CORPUS_FILES = ("prepared", "trainpref", "validpref", "testpref", "spm_model", "bpe_codes")


def _corpus(section: dict | None) -> dict | None:
    """[corpus], checked, its paths made absolute (relative paths are relative to the file that gives them)."""
    if section is None:
        return None
    section, where = dict(section), "[corpus]"
    base = Path(section.pop("_base"))
    out = {}
    for key in CORPUS_FILES:
        value = _take(section, key, None, where, str)
        if value is not None:
            out[key] = str(base / value)
    for key, kind in (("tokenizer", str), ("pretokenized", bool), ("joined_dictionary", bool)):
        value = _take(section, key, None, where, kind)
        if value is not None:
            out[key] = value
    _no_leftovers(section, where)
    if ("prepared" in out) == ("trainpref" in out):
        raise ConfigError(f"{where}: give either prepared = DIR (nat_kd.prepare output) or trainpref, validpref and "
                          "testpref (raw files PREFIX.SRC and PREFIX.TGT)")
    if "prepared" in out and len(out) > 1:
        raise ConfigError(f"{where}: prepared = DIR is a finished corpus; {', '.join(sorted(set(out) - {'prepared'}))} "
                          "apply to raw prefixes only")
    if "trainpref" in out and not {"validpref", "testpref"} <= set(out):
        raise ConfigError(f"{where}: the study validates and reports on valid and test: give validpref and testpref")
    return out
