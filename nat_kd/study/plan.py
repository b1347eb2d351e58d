"""The study as steps: prepare, teachers, distilled sets, mixes, sets of several references, their analysis,
NAT students, Born-Again rounds, the speed tables and the multi-modality experiment, in plan order (the step
functions themselves: nat_kd.engine.steps)."""
from __future__ import annotations

from dataclasses import asdict
from functools import partial
from pathlib import Path

from nat_kd.artifacts import PreparedCorpus
from nat_kd.engine.runner import Step, in_dependency_order
from nat_kd.engine.steps import (TEACHER_ARCH, analysis_step, distil_step, family_recipe, kept_hypotheses,
                                 kept_selection, kept_set, mix_step, modes_step, prepare_step, rebuild_selection,
                                 rebuild_set, references_step, selective_kd_step, speed_step, student_arch,
                                 student_step, train_step, training_settings, training_speed_step)

from .config import ConfigError, StudyConfig


ANALYSIS = "analysis"  # the analysis step; with [analysis] per_set, the prefix of one step a set


def analysis_result(results: dict) -> dict | None:
    """The study's analysis as one step's result, from the ``analysis`` step or from the per-set steps
    (``analysis.SET``) that have run: the real data's row once, then each set's, in the order of ``results``;
    None where no analysis has run."""
    if ANALYSIS in results:
        return results[ANALYSIS]
    parts = [r for name, r in results.items() if name.startswith(f"{ANALYSIS}.")]
    if not parts:
        return None
    rows = {row["name"]: row for part in parts for row in part["rows"]}
    return {**parts[0], "rows": list(rows.values()), "outputs": [o for part in parts for o in part["outputs"]]}


def build_plan(cfg: StudyConfig, results_dir: Path, data_dir: str | None = None) -> list[Step]:
    """The study's steps in plan order (a resumed run takes up the steps it had begun in this order): the
    corpus, the teachers with their distilled sets, the mixes, the analysis, the students, Born-Again rounds,
    the speed tables and the multi-modality experiment; a step that reads a later one's outputs (a mix that a
    student judges) moved after it."""
    plan = _Planner(cfg, results_dir, data_dir)
    plan.prepare("prepare", cfg.tgt, cfg.vocab_size, cfg.train_limit, cfg.corpus)
    plan.teachers_and_sets()
    plan.mixes_and_analysis()
    plan.students()
    plan.born_again()
    plan.speed()
    plan.modes()
    return in_dependency_order(plan.steps)


class _Planner:
    """build_plan's steps, added section by section."""

    def __init__(self, cfg: StudyConfig, results_dir: Path, data_dir: str | None):
        self.cfg, self.results_dir, self.data_dir = cfg, results_dir, data_dir
        self.steps: list[Step] = []
        self.evaluation = dict(cfg.evaluation)
        self.set_steps = [f"distil.{d.name}" for d in cfg.distilled] + [f"mix.{m.name}" for m in cfg.mixes]
        several = [f"references.{r.name}" for r in cfg.references]
        self.data_step = dict(zip(cfg.data_labels(), [None, *self.set_steps, *several]))  # a set's label -> its step
        # the analysis measures a union set (its pairs are a training set of their own); a set of several
        # references is its first set's, analysed as that, and a Selective KD set its distilled set's
        self.set_steps = [s for s in self.set_steps if s not in {f"mix.{m.name}" for m in cfg.mixes if m.selective_kd}]
        self.set_steps += [f"references.{r.name}" for r in cfg.references if r.union]

    def add(self, step_name, kind, fn, deps=(), where: dict | None = None, budget=(), in_driver=False, keep=None,
            rebuild=None, **settings):
        """``settings`` make the step's fingerprint; ``where`` (folders) only tells it where to read or
        write, so moving the corpus or the study folder redoes nothing; ``budget``, ``in_driver``, ``keep``,
        ``rebuild``: Step's."""
        self.steps.append(Step(step_name, kind, settings, partial(fn, **settings, **(where or {})), list(deps), budget,
                               in_driver, keep, rebuild))

    def prepare(self, step_name, tgt, vocab_size, train_limit, own=None):
        from nat_kd.corpus import data_dir as raw_dir
        from nat_kd.prepare import PrepareConfig, fingerprint

        src = self.cfg.src
        settings = dict(src=src, tgt=tgt, vocab_size=vocab_size, train_limit=train_limit)
        # the raw files' content is an input: a changed corpus file redoes the step and all that follows
        if own is None:
            corpus = fingerprint(raw_dir(self.data_dir), PrepareConfig(src, tgt, vocab_size, train_limit=train_limit))
            self.add(step_name, "prepare", prepare_step, where={"data_dir": self.data_dir}, **settings,
                     corpus=corpus[0])
        elif "prepared" in own:  # a finished corpus: its manifest's fingerprint says what it holds
            corpus = PreparedCorpus(own["prepared"]).manifest() or {}
            if "fingerprint" not in corpus:
                raise ConfigError(f"{own['prepared']}: no manifest.json; [corpus] prepared = DIR names a "
                                  "nat_kd.prepare output folder")
            self.add(step_name, "prepare", prepare_step, where={"data_dir": None, "own": own}, in_driver=True,
                     **settings, corpus=corpus["fingerprint"])
        else:
            corpus = fingerprint(None, PrepareConfig(src, tgt, vocab_size, train_limit=train_limit, **own))
            self.add(step_name, "prepare", prepare_step, where={"data_dir": None, "own": own}, **settings,
                     corpus=corpus[0])

    def train(self, name, *, data, arch, shape, training, nat_family=None, prepare="prepare", tgt=None, seed=1):
        # more updates later continue the training (its learning rate and glancing schedule do not depend on
        # the budget), its curve's earlier points kept
        self.add(name, "train", train_step, [prepare] + ([data] if data else []), budget=("updates",),
                 keep=kept_hypotheses,
                 prepare=prepare, data=data, arch=arch, shape=asdict(shape),
                 training=training_settings(training, nat_family), nat_family=nat_family,
                 evaluation=self.evaluation, tgt=tgt or self.cfg.tgt, **({"seed": seed} if seed != 1 else {}),
                 **family_recipe(nat_family))

    def student(self, family: str, label: str, seed: int = 1):
        cfg = self.cfg
        self.train(student_step(family, label, seed), data=self.data_step[label], arch=student_arch(family),
                   shape=cfg.student_shape, training=cfg.student_training, nat_family=family, seed=seed)

    def distil(self, step_name, teacher, strategy, name, prepare="prepare", tgt=None):
        cfg = self.cfg
        self.add(step_name, "distil", distil_step, [prepare, teacher], keep=kept_set,
                 rebuild=partial(rebuild_set, prepare=prepare), prepare=prepare, teacher=teacher,
                 strategy=strategy, decoding=cfg.decoding, max_tokens=cfg.distill_max_tokens, name=name,
                 tgt=tgt or cfg.tgt)

    def teachers_and_sets(self):
        """Each teacher, followed by its distilled sets (with one step at a time, a teacher's data is made
        before the next teacher trains)."""
        for teacher in self.cfg.teachers:
            self.train(f"teacher.{teacher.name}", data=None, arch=TEACHER_ARCH, shape=teacher.shape,
                       training=teacher.training, seed=teacher.seed)
            for d in [d for d in self.cfg.distilled if d.teacher == teacher.name]:
                self.distil(f"distil.{d.name}", f"teacher.{d.teacher}", d.strategy, d.name)

    def mixes_and_analysis(self):
        """The mixes of the distilled sets with the real data (nat_kd.mix), then the analysis of every set."""
        cfg = self.cfg
        for m in cfg.mixes:
            if m.selective_kd:
                # kept by a store: its evaluator's accuracies are all that the evaluator's checkpoint makes
                self.add(f"mix.{m.name}", "mix", selective_kd_step, ["prepare", f"distil.{m.of}",
                                                                     m.selective_kd["evaluator"]],
                         keep=kept_selection, rebuild=partial(rebuild_selection, of=f"distil.{m.of}",
                                                              prepare="prepare"),
                         prepare="prepare", of=f"distil.{m.of}", selective_kd=m.selective_kd, name=m.name)
                continue
            judge = [m.rule["judge"]] if m.rule.get("judge") else []
            self.add(f"mix.{m.name}", "mix", mix_step, ["prepare", f"distil.{m.of}", *judge], prepare="prepare",
                     of=f"distil.{m.of}", rule=m.rule, name=m.name, tgt=cfg.tgt)
        for r in cfg.references:
            sets = [f"distil.{label}" for label in r.of]
            several = {} if r.union else {"criterion": r.criterion()}
            self.add(f"references.{r.name}", "mix", references_step, ["prepare", *sets], prepare="prepare", sets=sets,
                     union=r.union, name=r.name, tgt=cfg.tgt, **several)
        # the detailed measures are settings only when asked for, so the other profiles' analysis stays as it was;
        # per_set only splits the steps, so it is no setting of theirs
        measures = {k: v for k, v in cfg.analysis.items() if k != "per_set"}
        details = {"details": measures} if cfg.analysis["detailed"] else {}
        # per set, a set is measured as soon as it is made, not once every teacher (a GPU's base rung) has one
        groups = ({f"{ANALYSIS}.{s}": [s] for s in self.set_steps} if cfg.analysis["per_set"]
                  else {ANALYSIS: self.set_steps})
        for name, sets in groups.items():
            self.add(name, "analysis", analysis_step, ["prepare", *sets],
                     where={"out": str(self.results_dir / name)}, prepare="prepare", sets=sets, src=cfg.src,
                     tgt=cfg.tgt, **details)

    def students(self):
        """The NAT students on the real data and on every training set; more seeds on some sets."""
        for family in self.cfg.student_families:
            for label in self.cfg.sets_of(family):
                self.student(family, label)
        for seed in self.cfg.student_seeds:
            for family, labels in self.cfg.seed_sets.items():
                for label in labels:
                    self.student(family, label, seed)

    def born_again(self):
        """A student-sized AT learns from its own outputs, round after round."""
        cfg, previous = self.cfg, None
        for r in range(1, cfg.born_again_rounds + 1):
            self.train(f"born_again.{r}.at", data=previous, arch=TEACHER_ARCH, shape=cfg.born_again_shape,
                       training=cfg.teacher_training)
            self.distil(f"born_again.{r}.distil", f"born_again.{r}.at", "beam", f"born-again {r}")
            previous = f"born_again.{r}.distil"
            self.train(f"born_again.{r}.student", data=previous, arch=student_arch(cfg.born_again_student),
                       shape=cfg.student_shape, training=cfg.student_training, nat_family=cfg.born_again_student)

    def speed(self):
        """Speed against quality: the teacher's decodes and NAT students on the test set, one thread; and
        fairseq-train's speed of each family."""
        cfg = self.cfg
        if cfg.speed:
            sp = cfg.speed
            systems = {f"teacher {sp.teacher} {s}": {"step": f"teacher.{sp.teacher}",
                                                     "beam": self.evaluation["beam"] if s == "beam" else 1}
                       for s in sp.teacher_strategies}
            for family in sp.students:
                if family not in cfg.student_families:  # a family trained for the speed table alone
                    self.student(family, sp.data)
                systems[f"{family} on {sp.data}"] = {"step": student_step(family, sp.data), "nat_family": family}
            self.add("speed", "speed", speed_step, ["prepare", *dict.fromkeys(s["step"] for s in systems.values())],
                     prepare="prepare", systems=systems, batchings=list(sp.batchings), repeats=sp.repeats,
                     evaluation=self.evaluation, tgt=cfg.tgt)
        if cfg.training_speed:
            ts = cfg.training_speed
            data = self.data_step[ts.data]
            self.add("training_speed", "speed", training_speed_step, ["prepare"] + ([data] if data else []),
                     prepare="prepare", data=data, families=list(ts.families), shape=asdict(cfg.student_shape),
                     training=asdict(cfg.student_training), updates=ts.updates, repeats=ts.repeats)

    def modes(self):
        """Multi-modality: an AT and a NAT on the untagged en -> {de, fr, cs} corpus, the AT's distilled set, the
        NAT on it, and the language mix of their outputs."""
        cfg, m = self.cfg, self.cfg.modes
        if not m:
            return
        self.prepare("modes.prepare", "mix", m["vocab_size"], m["train_limit"])
        mix = dict(prepare="modes.prepare", tgt="mix")
        self.train("modes.at", data=None, arch=TEACHER_ARCH, shape=m["at"], training=m["training"], **mix)
        self.train("modes.nat.real", data=None, arch=student_arch("nat"), shape=m["nat"], training=m["training"],
                   nat_family="nat", **mix)
        self.distil("modes.distil", "modes.at", "beam", "mix.beam", **mix)
        self.train("modes.nat.distilled", data="modes.distil", arch=student_arch("nat"), shape=m["nat"],
                   training=m["training"], nat_family="nat", **mix)
        systems = {"AT": "modes.at", "NAT (real data)": "modes.nat.real", "NAT (distilled data)": "modes.nat.distilled"}
        self.add("modes.analysis", "modes", modes_step, ["modes.prepare", "modes.distil", *systems.values()],
                 prepare="modes.prepare", systems=systems, distilled="modes.distil", src=cfg.src)
