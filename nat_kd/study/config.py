"""The study's configuration: a TOML file (see profiles/*.toml) read into dataclasses, checked up front.

Every section has defaults, so a config names only what it changes; unknown keys are errors (a typo would
otherwise silently run the default). ``profile_path`` resolves a bundled profile's name (``profile_names``).
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from nat_kd.errors import NatKdError
from nat_kd.settings_file import check_value, dataclass_from_table, read_toml
from nat_kd.engine.training import TRAINING_SPEED_INTERVAL, Training
from nat_kd.launch.settings import ClusterConfig, cluster_config

if TYPE_CHECKING:  # imported where needed: importing the plugin registers its models with fairseq
    from fairseq_plugins.models.sizes import ModelSize

PROFILES = Path(__file__).parent / "profiles"
# [analysis]: the detailed measures of nat_kd.analysis.report.DetailedAnalysisReport (off unless detailed = true)
ANALYSIS_DEFAULTS = {"detailed": False,
                     "per_set": False,  # each distilled set's analysis its own step (plan.analysis_result)
                     "buckets": [1, 2, 5, 20, 100],  # lower edges of the source-frequency buckets of C(d)
                     "floors": [1e-9, 1e-6, 1e-3],  # F(d) at each smoothing floor
                     "interpolation": 0.1,  # lambda of the interpolated F(d)
                     "repeat_n": [2, 3]}  # share of outputs in which some n-gram occurs twice, for each n


class ConfigError(NatKdError):
    """A problem in the config file; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class TeacherSpec:
    name: str
    shape: ModelSize
    training: Training  # [teachers.training], with the keys of its own [teachers.models.training] over it
    seed: int = 1  # teachers of one shape and training with other seeds: several references per sentence


@dataclass(frozen=True)
class DistillSpec:
    teacher: str
    strategy: str

    @property
    def name(self) -> str:
        return f"{self.teacher}.{self.strategy}"


@dataclass(frozen=True)
class MixSpec:
    """[[mixes]]: a training set made from a distilled set (its name is the set's label): by nat_kd.mix, or with
    ``evaluator`` a Selective KD set (nat_kd.selective_kd), whose students pick each line's target per batch."""
    name: str
    of: str  # the distilled set it mixes, by its label (TEACHER.STRATEGY)
    rule: dict  # nat_kd.mix.MixRule fields ({} for a Selective KD set)
    # Selective KD: evaluator (a CTC student of the study) and the threshold's settings given, the fields of
    # fairseq_plugins.tasks.SelectiveKdConfig (the others its defaults)
    selective_kd: dict | None = None


@dataclass(frozen=True)
class ReferencesSpec:
    """[[references]]: a training set made from several distilled sets of the same sources (its name is the
    set's label): every line with each set's target, for students that take several references a sentence
    (``selection``: multi_reference_nat_loss's --reference-selection, DDRS's "ddrs" with its schedule's
    ``ddrs_max_update`` and ``ddrs_save_interval_updates``, None for the criterion's defaults), or with
    ``union`` the sets' pairs one after the other, one target a line (plain KD on all of them)."""
    name: str
    of: tuple[str, ...]  # the distilled sets, by their labels (TEACHER.STRATEGY), the first the main reference
    union: bool = False
    selection: str = "ddrs"
    ddrs_max_update: int | None = None
    ddrs_save_interval_updates: int | None = None

    def description(self) -> str:
        """How the set is made, as the results' tables name a training set's decoding."""
        sets = ", ".join(self.of)
        return f"union of {sets}" if self.union else f"{len(self.of)} references a line ({sets}), {self.selection}"

    def criterion(self) -> dict:
        """The student's multi_reference_nat_loss settings (flag names with underscores)."""
        ddrs = {k: getattr(self, k) for k in ("ddrs_max_update", "ddrs_save_interval_updates")
                if getattr(self, k) is not None}
        return {"references": len(self.of), "reference_selection": self.selection, **ddrs}


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
    student_shape: ModelSize
    student_training: Training
    evaluation: dict  # beam, max_tokens
    analysis: dict  # detailed and per_set (bools) and the detailed measures' settings (see ANALYSIS_DEFAULTS)
    born_again_rounds: int
    born_again_student: str
    born_again_shape: ModelSize
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
    references: tuple[ReferencesSpec, ...] = ()
    # the training sets each family learns from (a family not named: every set)
    student_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def data_labels(self) -> list[str]:
        """Every training set's label, in plan order: the real data, the distilled sets, the mixes, the sets of
        several references."""
        return (["real"] + [d.name for d in self.distilled] + [m.name for m in self.mixes]
                + [r.name for r in self.references])

    def sets_of(self, family: str) -> list[str]:
        """The training sets ``family``'s students learn from, in plan order."""
        return [label for label in self.data_labels() if label in self.student_sets.get(family, self.data_labels())]
    # [launcher] and [resources.*]: the steps as cluster jobs (nat_kd.engine.cluster; docs/cluster.md)
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
    """``table[key]`` (removed from it) of type ``kind`` (None: any), else ``default`` (MISSING: required)."""
    value = table.pop(key, default)
    if value is MISSING:
        raise ConfigError(f"{where}: missing key '{key}'")
    if kind is None or value is None:
        return value
    if isinstance(kind, tuple):
        if not isinstance(value, kind):
            raise ConfigError(f"{where}.{key} = {value!r}: expected {' or '.join(k.__name__ for k in kind)}")
        return value
    return check_value(value, kind, f"{where}.{key}", ConfigError)


def _no_leftovers(table: dict, where: str) -> None:
    if table:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(table))}; check the spelling against "
                          "nat_kd/study/profiles/cpu.toml")


def _dataclass(cls, table: dict, where: str):
    return dataclass_from_table(cls, table, where, ConfigError)


def load(path: str | Path, corpus: str | Path | None = None) -> StudyConfig:
    """The config (a bundled profile's name or a TOML file); ``corpus``: a TOML file whose [corpus] section
    (and [study] src, tgt) replace the config's, to run a profile on your own corpus."""
    path = profile_path(str(path))
    raw = read_toml(path, ConfigError)
    if corpus is not None:
        corpus = Path(corpus)
        overlay = read_toml(corpus, ConfigError)
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
    except (ConfigError, TypeError) as err:
        raise ConfigError(f"{path}: {err}") from None


def _build(raw: dict, path: Path) -> StudyConfig:
    """The config's sections, each read and checked by its own function, in the order they depend on."""
    study = _study(raw.pop("study", {}), path)
    teachers, teacher_training = _teachers(raw.pop("teachers", {}))
    distilled, decoding, max_tokens = _distill(raw.pop("distill", {}), teachers)
    students = _students(raw.pop("students", {}))
    mixes = _mixes(raw.pop("mixes", []), {d.name for d in distilled})
    references = _references(raw.pop("references", []), {d.name for d in distilled},
                             {"real", *(d.name for d in distilled), *(m.name for m in mixes)})
    labels = ["real"] + [d.name for d in distilled] + [m.name for m in mixes] + [r.name for r in references]
    seed_sets = _seed_sets(students.pop("seed_sets"), students["families"], labels, "[students].seed_sets")
    student_sets = _seed_sets(students.pop("sets"), students["families"], labels, "[students].sets")
    _check_references_learners(references, student_sets, students["families"], labels)
    _check_evaluators(mixes, student_sets, students["families"], labels)
    speed = _speed(raw.pop("speed", None), teachers, labels)
    training_speed = _training_speed(raw.pop("training_speed", None), labels)
    evaluation = _evaluation(raw.pop("evaluation", {}))
    _check_trainings(teacher_training, students["training"], teachers)
    analysis = _analysis(raw.pop("analysis", {}))
    born = _born_again(raw.pop("born_again", {}), students["families"], students["shape"])
    corpus = _corpus(raw.pop("corpus", None))
    modes = raw.pop("modes", None)
    # the multi-modality experiment needs Multi30k's four languages: not on your own corpus
    modes = _modes(modes, study["vocab_size"]) if corpus is None else None
    _no_leftovers(raw, "top level")
    return StudyConfig(**study, teachers=teachers, teacher_training=teacher_training, distilled=distilled,
                       decoding=decoding, distill_max_tokens=max_tokens, student_families=students["families"],
                       student_shape=students["shape"], student_training=students["training"],
                       evaluation=evaluation, analysis=analysis, **born, modes=modes, source=path, corpus=corpus,
                       mixes=mixes, student_seeds=students["seeds"], seed_sets=seed_sets, speed=speed,
                       training_speed=training_speed, references=references, student_sets=student_sets)


def _study(section: dict, path: Path) -> dict:
    section, where = dict(section), "[study]"
    out = {"name": _take(section, "name", path.stem, where, str), "src": _take(section, "src", "en", where, str),
           "tgt": _take(section, "tgt", "de", where, str),
           "vocab_size": _take(section, "vocab_size", 8000, where, int),
           "train_limit": _take(section, "train_limit", 0, where, int) or None,
           "jobs": _take(section, "jobs", 2, where, int)}
    _no_leftovers(section, where)
    return out


def _teachers(section: dict) -> tuple[tuple[TeacherSpec, ...], Training]:
    """[[teachers.models]], each with [teachers.training] under its own [teachers.models.training]."""
    from fairseq_plugins.models.sizes import ModelSize

    section = dict(section)
    shapes = section.pop("models", None)
    if not shapes:
        raise ConfigError("[teachers]: give [[teachers.models]] entries (name, embed_dim, ffn_dim, layers, heads), "
                          "smallest first")
    defaults = dict(section.pop("training", {}))
    teacher_training = _dataclass(Training, defaults, "[teachers.training]")
    teachers = []
    for entry in shapes:
        entry = dict(entry)
        name = str(_take(entry, "name", MISSING, "[[teachers.models]]"))
        seed = _take(entry, "seed", 1, f"[[teachers.models]] {name}", int)
        training = _dataclass(Training, defaults | entry.pop("training", {}), f"[[teachers.models]] {name}: training")
        teachers.append(TeacherSpec(name, _dataclass(ModelSize, entry, f"[[teachers.models]] {name}"), training,
                                    seed))
    if len({t.name for t in teachers}) != len(teachers):
        raise ConfigError("[[teachers.models]]: teacher names must differ")
    _no_leftovers(section, "[teachers]")
    return tuple(teachers), teacher_training


def _distill(section: dict, teachers: tuple[TeacherSpec, ...]) -> tuple[tuple[DistillSpec, ...], dict, int]:
    """The distilled sets (every beam teacher's beam set, one teacher's other methods), the decoding settings
    (nat_kd.distill.decoding.DecodingSettings fields: what [distill] holds besides) and the batch size."""
    from nat_kd.distill.decoding import STRATEGIES, DecodingSettings

    section, where = dict(section), "[distill]"
    names = [t.name for t in teachers]
    beam_teachers = _take(section, "beam_teachers", names, where, list)
    methods_teacher = _take(section, "methods_teacher", names[len(names) // 2], where, str)
    methods = _take(section, "methods", ["greedy", "topk", "sampling", "seq-inter"], where, list)
    max_tokens = _take(section, "max_tokens", 3000, where, int)
    known = {f.name for f in fields(DecodingSettings)} - {"strategy"}  # the strategy is the set's own
    if set(section) - known:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(set(section) - known))}; decoding keys are "
                          f"{', '.join(sorted(known))}")
    for teacher in [*beam_teachers, methods_teacher]:
        if teacher not in names:
            raise ConfigError(f"{where}: teacher '{teacher}' is not one of [[teachers.models]] ({', '.join(names)})")
    for method in methods:
        if method not in STRATEGIES:
            raise ConfigError(f"{where}.methods: unknown strategy '{method}'; choose from {', '.join(STRATEGIES)}")
    distilled = tuple([DistillSpec(t, "beam") for t in beam_teachers]
                      + [DistillSpec(methods_teacher, m) for m in methods if m != "beam"])
    return distilled, section, max_tokens


def _students(section: dict) -> dict:
    """[students]: the families, their shape and training, the extra seeds (seed_sets checked by the caller,
    which knows the training sets)."""
    from fairseq_plugins.models.sizes import ModelSize

    section, where = dict(section), "[students]"
    families = tuple(_take(section, "families", ["nat", "cmlm"], where, list))
    _check_families(families, f"{where}.families")
    out = {"families": families, "shape": _dataclass(ModelSize, section.pop("model", {}), "[students.model]"),
           "training": _dataclass(Training, section.pop("training", {}), "[students.training]"),
           "seeds": tuple(_take(section, "seeds", [], where, list)),  # beyond seed 1, which every student has
           "seed_sets": _take(section, "seed_sets", [], where, (list, dict)),
           "sets": _take(section, "sets", {}, where, (list, dict))}  # the sets each family learns from
    _no_leftovers(section, where)
    seeds = out["seeds"]
    if any(not isinstance(x, int) or x == 1 for x in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}.seeds = {list(seeds)}: give distinct integers other than 1 (every student "
                          "trains with seed 1 already)")
    if bool(seeds) != bool(out["seed_sets"]):
        raise ConfigError(f"{where}: seeds and seed_sets go together (which seeds, on which training sets)")
    return out


def _evaluation(section: dict) -> dict:
    section, where = dict(section), "[evaluation]"
    evaluation = {"beam": _take(section, "beam", 5, where, int),
                  "max_tokens": _take(section, "max_tokens", 8192, where, int),
                  # AT output length limit a * source length + b (fairseq's defaults; NATs predict theirs)
                  "max_len_a": _take(section, "max_len_a", 0.0, where, float),
                  "max_len_b": _take(section, "max_len_b", 200, where, int),
                  # valid BLEU is informative only (checkpoints are chosen on valid loss); test is reported
                  "splits": _take(section, "splits", ["valid", "test"], where, list)}
    if "test" not in evaluation["splits"]:
        raise ConfigError(f"{where}.splits: must include 'test' (the reported figure)")
    _no_leftovers(section, where)
    return evaluation


def _check_trainings(teacher_training: Training, student_training: Training,
                     teachers: tuple[TeacherSpec, ...]) -> None:
    for training, where in [(teacher_training, "[teachers.training]"), (student_training, "[students.training]"),
                            *[(t.training, f"[[teachers.models]] {t.name}") for t in teachers]]:
        if training.patience and not training.bleu_every:
            raise ConfigError(f"{where}: patience = {training.patience} needs bleu_every > 0 (patience counts "
                              "validation BLEU measurements)")
        if training.glance_anneal_updates and training is not student_training:
            raise ConfigError(f"{where}: glance_anneal_updates is for glancing students: move it to "
                              "[students.training]")


def _analysis(section: dict) -> dict:
    section, where = dict(section), "[analysis]"
    analysis = {key: _take(section, key, default, where, type(default) if key != "interpolation" else float)
                for key, default in ANALYSIS_DEFAULTS.items()}
    if not 0 < analysis["interpolation"] < 1:
        raise ConfigError(f"{where}.interpolation = {analysis['interpolation']}: must be in (0, 1)")
    _no_leftovers(section, where)
    return analysis


def _born_again(section: dict, families: tuple[str, ...], student_shape) -> dict:
    from fairseq_plugins.models.sizes import ModelSize

    section, where = dict(section), "[born_again]"
    rounds = _take(section, "rounds", 0, where, int)
    student = _take(section, "student", families[0], where, str)
    if student not in families:
        raise ConfigError(f"{where}.student: '{student}' is not one of [students].families")
    shape = _dataclass(ModelSize, section.pop("model", {}), "[born_again.model]") if rounds else student_shape
    _no_leftovers(section, where)
    return {"born_again_rounds": rounds, "born_again_student": student, "born_again_shape": shape}


def _modes(section: dict | None, vocab_size: int) -> dict | None:
    from fairseq_plugins.models.sizes import ModelSize

    if section is None:
        return None
    section, where = dict(section), "[modes]"
    modes = {"train_limit": _take(section, "train_limit", 0, where, int) or None,
             "vocab_size": _take(section, "vocab_size", vocab_size, where, int),
             "at": _dataclass(ModelSize, section.pop("at_model", {}), "[modes.at_model]"),
             "nat": _dataclass(ModelSize, section.pop("nat_model", {}), "[modes.nat_model]"),
             "training": _dataclass(Training, section.pop("training", {}), "[modes.training]")}
    _no_leftovers(section, where)
    return modes


def _mixes(entries: list, distilled: set[str]) -> tuple[MixSpec, ...]:
    """[[mixes]]: name, of (a distilled set's label) and the nat_kd.mix rule's keys, or Selective KD's
    (evaluator and the threshold's settings)."""
    from nat_kd.mix import MixRule

    rule_keys = {f.name for f in fields(MixRule)}
    out = []
    for entry in entries:
        entry, where = dict(entry), "[[mixes]]"
        name = _take(entry, "name", MISSING, where, str)
        of = _take(entry, "of", MISSING, f"{where} {name}", str)
        if of not in distilled:
            raise ConfigError(f"{where} {name}: of = '{of}' is not a distilled set ({', '.join(sorted(distilled))})")
        if "evaluator" in entry:
            out.append(MixSpec(name, of, {}, _selective_kd(entry, f"{where} {name}")))
            continue
        unknown = set(entry) - rule_keys
        if unknown:
            raise ConfigError(f"{where} {name}: unknown key(s) {', '.join(sorted(unknown))}; a mix takes name, of "
                              f"and the rule's keys ({', '.join(sorted(rule_keys))}), or Selective KD's evaluator")
        try:
            MixRule(**entry).validate()
        except NatKdError as err:
            raise ConfigError(f"{where} {name}: {err}") from None
        out.append(MixSpec(name, of, entry))
    names = [m.name for m in out]
    if len(set(names)) != len(names) or set(names) & (distilled | {"real"}):
        raise ConfigError("[[mixes]]: names must differ from each other, from 'real' and from the distilled sets")
    return tuple(out)


def _selective_kd(entry: dict, where: str) -> dict:
    """A Selective KD [[mixes]] entry's evaluator and threshold settings (SelectiveKdConfig's fields), checked."""
    from fairseq_plugins.tasks import SelectiveKdConfig

    own = {f.name: f.type for f in fields(SelectiveKdConfig) if f.name.startswith("kd_threshold")}
    unknown = set(entry) - {"evaluator", *own}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a Selective KD set takes evaluator "
                          f"and {', '.join(sorted(own))}")
    settings = {"evaluator": _take(entry, "evaluator", MISSING, where, str)}
    for key, kind in own.items():
        if key in entry:
            settings[key] = _take(entry, key, MISSING, where, float if kind in (float, "float") else int)
    if settings.get("kd_threshold_updates", 1) <= 0:
        raise ConfigError(f"{where}: kd_threshold_updates = {settings['kd_threshold_updates']}: the update at which "
                          "the threshold has risen by its offset, above 0")
    return settings


def _references(entries: list, distilled: set[str], taken: set[str]) -> tuple[ReferencesSpec, ...]:
    """[[references]]: name, of (two distilled sets' labels or more), union, selection and DDRS's schedule."""
    from fairseq_plugins.criterions.multi_reference import SELECTIONS

    out = []
    for entry in entries:
        entry, where = dict(entry), "[[references]]"
        name = _take(entry, "name", MISSING, where, str)
        where = f"{where} {name}"
        spec = dataclass_from_table(ReferencesSpec, entry, where, ConfigError, name=name)
        if len(spec.of) < 2 or len(set(spec.of)) != len(spec.of):
            raise ConfigError(f"{where}: of = {list(spec.of)}: give two distilled sets or more, each once")
        for label in spec.of:
            if label not in distilled:
                raise ConfigError(f"{where}: '{label}' is not a distilled set ({', '.join(sorted(distilled))})")
        if spec.selection not in SELECTIONS:
            raise ConfigError(f"{where}: selection = {spec.selection!r}: {', '.join(map(repr, SELECTIONS))} (ddrs: DDRS's "
                              "annealed loss; the others per token, not DDRS's)")
        if spec.union and {"selection", "ddrs_max_update", "ddrs_save_interval_updates"} & set(entry):
            raise ConfigError(f"{where}: union = true makes one reference a line: drop selection and the ddrs keys")
        if spec.selection != "ddrs" and {"ddrs_max_update", "ddrs_save_interval_updates"} & set(entry):
            raise ConfigError(f"{where}: ddrs_max_update and ddrs_save_interval_updates are DDRS's schedule: give them "
                              "with selection = 'ddrs'")
        out.append(spec)
    names = [r.name for r in out]
    if len(set(names)) != len(names) or set(names) & taken:
        raise ConfigError("[[references]]: names must differ from each other, from 'real', the distilled sets and the "
                          "mixes")
    return tuple(out)


def _check_references_learners(references: tuple[ReferencesSpec, ...], student_sets: dict,
                                families: tuple[str, ...], labels: list[str]) -> None:
    """Only families whose loss takes several references a sentence, with the set's selection, learn from such a
    set."""
    from fairseq_plugins.models.nat import STUDENT_FAMILIES

    for family in families:
        learns = [r for r in references if not r.union and r.name in student_sets.get(family, labels)]
        takes = STUDENT_FAMILIES[family].references
        if learns and not takes:
            takers = ", ".join(f for f, spec in STUDENT_FAMILIES.items() if spec.references)
            raise ConfigError(f"[students]: {family} students take one reference a sentence, not the set(s) "
                              f"{', '.join(sorted(r.name for r in learns))}: give them their own sets, [students] sets "
                              f"= {{{family} = [...]}} (families that take several: {takers})")
        for r in learns:
            if r.selection not in takes:
                raise ConfigError(f"[[references]] {r.name}: selection = {r.selection!r}, which {family} students do "
                                  f"not take ({', '.join(takes)}): give them another set, or another selection")


def _check_evaluators(mixes: tuple[MixSpec, ...], student_sets: dict, families: tuple[str, ...],
                      labels: list[str]) -> None:
    """A mix's judge, or a Selective KD set's evaluator, is a student step of the plan (student.FAMILY.SET) that
    learns from something else than the mix itself; Selective KD's is a CTC student."""
    from nat_kd.selective_kd import EVALUATOR_FAMILIES

    students = {f"student.{family}.{label}" for family in families for label in student_sets.get(family, labels)}
    for m in mixes:
        key, step = ("evaluator", m.selective_kd["evaluator"]) if m.selective_kd else ("judge", m.rule.get("judge"))
        if step is None:
            continue
        if step not in students or step.endswith(f".{m.name}"):
            raise ConfigError(f"[[mixes]] {m.name}: {key} = {step!r} is not a student of this study on another set "
                              f"(student.FAMILY.SET, e.g. student.{families[0]}.real)")
        if m.selective_kd and step.split(".")[1] not in EVALUATOR_FAMILIES:
            raise ConfigError(f"[[mixes]] {m.name}: evaluator = {step!r}: Selective KD's evaluator is a CTC student "
                              f"({', '.join(EVALUATOR_FAMILIES)}), as the authors' GLAT+CTC, e.g. "
                              f"student.glat_ctc.{m.of}")


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
