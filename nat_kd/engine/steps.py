"""The steps every command that trains builds on (the study, choose's pilots): prepare a corpus, train a model
(AT or NAT) and evaluate it, distil a set, mix one, make a set of several references, analyse the sets, time
decoding and training, the multi-modality diagnostic. Each function is small: it calls the library or a model
job (fairseq_jobs) and returns what the results need (paths, BLEU, counts), plus the ``outputs`` that identify
it; and the names the steps and students go by.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from fairseq_plugins.models.sizes import ModelSize
from nat_kd.artifacts import DistilledSet, PreparedCorpus
from nat_kd.corpus import iter_lines, read_lines
from nat_kd.errors import SettingsError

from . import fairseq_jobs as jobs
from .runner import StepContext
from .store import Kept
from .training import ARCH_SHAPE, TRAINING_SPEED_INTERVAL, Training

TEACHER_ARCH = "kd_transformer_tiny"  # sizes come from the config's shapes, on the command line


# Families whose training changed in a way no setting shows, with the version of their training now: a training
# step's settings carry it (``recipe``), so that a record made before neither counts as done nor stands in for
# the step by --reuse. dat 2: the DA-Transformer's glancing as its authors' code does it (number-random's
# rounding, force-emit of the glanced tokens).
RECIPES = {"dat": 2}


def family_recipe(nat_family: str | None) -> dict:
    """The settings that name a family's version of its training (RECIPES), or none."""
    return {"recipe": RECIPES[nat_family]} if nat_family in RECIPES else {}


def student_arch(family: str) -> str:
    return f"kd_{family}_tiny"


def student_family(arch: str) -> str:
    """The NAT family of a kd_* student architecture; an AT or unknown one is a SettingsError."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_plugins.models.nat import STUDENT_ARCHS

    if arch in STUDENT_ARCHS:
        return STUDENT_ARCHS[arch][0]
    students = sorted(a for a in STUDENT_ARCHS if a.endswith("_tiny"))
    if arch in ARCH_MODEL_REGISTRY:
        from fairseq.models.nat import FairseqNATModel

        what = ("a fairseq NAT model, not one of nat-kd's students" if issubclass(ARCH_MODEL_REGISTRY[arch],
                FairseqNATModel) else "an autoregressive model, not a NAT student")
        raise SettingsError(f"--arch {arch} is {what}: give a kd_FAMILY_SIZE architecture, e.g. "
                            f"{', '.join(students)}")
    raise SettingsError(f"--arch {arch}: no such architecture; give a kd_FAMILY_SIZE one, e.g. {', '.join(students)}")


def student_step(family: str, data: str, seed: int = 1) -> str:
    """The step that trains ``family`` on the training set labelled ``data``, with ``seed``."""
    return f"student.{family}.{data}" + (f".seed{seed}" if seed != 1 else "")


def student_shape(label: str) -> ModelSize | None:
    """--shape LAYERSxWIDTH (ModelSize.parse), or ARCH_SHAPE: None, the architecture's own sizes."""
    if label == ARCH_SHAPE:
        return None
    try:
        return ModelSize.parse(label)
    except ValueError as err:
        raise SettingsError(f"--shape {err}; or '{ARCH_SHAPE}' for the architecture's own sizes") from None


def shape_label(arch: str, shape: dict | ModelSize | None) -> str:
    """LAYERSxWIDTH of a student: its shape's, else its architecture's own size's (kd_glat_tiny: 3x256)."""
    from fairseq_plugins.models.sizes import SIZES

    if shape is None:
        size = SIZES[arch.rsplit("_", 1)[1]]
        return f"{size.layers}x{size.embed_dim}"
    return (ModelSize(**shape) if isinstance(shape, dict) else shape).label


def count_parameters(arch: str, shape: ModelSize | None, vocab_size: int) -> int:
    """``shape`` None: the architecture's own sizes."""
    from fairseq_plugins.counting import build_model

    overrides = shape.overrides() if shape else {}
    return sum(p.numel() for p in build_model(arch, vocab_size, **overrides).parameters())


# ---------------------------------------------------------------- step functions

def prepare_step(ctx: StepContext, *, src: str, tgt: str, vocab_size: int, train_limit: int | None,
                 data_dir: str | None, corpus: str, own: dict | None = None) -> dict:
    """Multi30k (or, with ``own``, the [corpus] section's raw prefixes) prepared into the step's folder, or
    the [corpus] section's prepared folder as it is."""
    from nat_kd.prepare import PrepareConfig, prepare

    if own and "prepared" in own:
        out = Path(own["prepared"])
    else:
        out = prepare(PrepareConfig(src, tgt, vocab_size=vocab_size, train_limit=train_limit, **(own or {})),
                      raw_dir=data_dir, out_dir=ctx.work / "data")
    prepared = PreparedCorpus(out)
    return {"dir": str(out), "outputs": [str(prepared.manifest_file)],
            "train_pairs": sum(1 for _ in iter_lines(prepared.raw("train", src)))}  # counted, not held


def _evaluate(ctx: StepContext, prepared: PreparedCorpus, bin_dir: Path, checkpoint: Path, evaluation: dict,
              nat_family: str | None, tgt: str) -> dict:
    """BLEU on valid (selection) and test (the figure we report), detokenized, against the raw references."""
    out = {}
    settings = {k: v for k, v in evaluation.items() if k != "splits"}
    for split in evaluation["splits"]:
        hyps = jobs.translate(bin_dir, checkpoint, split, ctx.work / f"{split}.hyp", log=ctx.log,
                              threads=ctx.threads, nat_family=nat_family, tokenization=prepared.tokenization(),
                              languages=prepared.language_pair(), fp16=ctx.fp16, device=ctx.device, **settings)
        score = jobs.bleu(hyps, read_lines(prepared.raw(split, tgt)))
        out[f"{split}_bleu"], out["bleu_signature"] = score["bleu"], score["signature"]
        out[f"{split}_hypotheses"] = str(ctx.work / f"{split}.hyp")
    return out


def train_step(ctx: StepContext, *, prepare: str, data: str | None, arch: str, shape: dict | None, training: dict,
               nat_family: str | None, evaluation: dict, tgt: str, seed: int = 1, recipe: int | None = None) -> dict:
    """Train one model (AT or NAT) on the prepared data or on a distilled set, then evaluate it. With
    ``bleu_every`` the checkpoint is the one with the best validation BLEU and the result holds the curve;
    otherwise it is fairseq's best on validation loss. ``shape`` None: the architecture's own sizes;
    ``recipe``: the family's version of its training (RECIPES), a setting for the fingerprint alone."""
    prepared = PreparedCorpus(ctx.results[prepare]["dir"])
    bin_dir = (DistilledSet(ctx.results[data]["dir"]).bin if data else prepared.bin).root
    shape_, training_ = ModelSize(**shape) if shape else None, Training(**training)
    save_dir = ctx.work / "checkpoints"
    # a set of several references a sentence: the student's loss takes them all (references_step); a Selective KD
    # set: its task picks each line's target per batch (selective_kd_step)
    made = ctx.results[data] if data else {}
    references, selective_kd = made.get("criterion"), made.get("selective_kd")

    def train(budget: Training) -> Path:
        return jobs.train(bin_dir, save_dir, arch=arch, shape=shape_, training=budget, log=ctx.log,
                          threads=ctx.threads, nat_family=nat_family, seed=seed, gpus=ctx.gpus, fp16=ctx.fp16,
                          references=references, selective_kd=selective_kd, save_updates=ctx.save_updates,
                          device=ctx.device)

    result = {"parameters": count_parameters(arch, shape_, _vocab_size(prepared)),
              "shape": shape_.label if shape_ else arch, "seed": seed}
    splits = evaluation["splits"]
    if training_.bleu_every:
        from .curve import train_with_curve

        settings = {k: v for k, v in evaluation.items() if k != "splits"}
        valid_references = read_lines(prepared.raw("valid", tgt))

        def valid_bleu(checkpoint: Path, hypotheses: Path) -> dict:
            return jobs.bleu(jobs.translate(bin_dir, checkpoint, "valid", hypotheses, log=ctx.log,
                                            threads=ctx.threads, nat_family=nat_family,
                                            tokenization=prepared.tokenization(),
                                            languages=prepared.language_pair(), fp16=ctx.fp16, device=ctx.device,
                                            **settings),
                             valid_references)

        result |= train_with_curve(save_dir, training_, train, valid_bleu)
        checkpoint = Path(result["checkpoint"])
        splits = [s for s in splits if s != "valid"]  # measured on the curve, with this very checkpoint
    else:
        checkpoint = train(training_)
        result["checkpoint"] = str(checkpoint)
    result["outputs"] = [str(checkpoint)]
    # the updates trained twice: a killed or requeued run resumes from its last checkpoint
    result["repeated_updates"] = jobs.count_repeated_updates(save_dir, ctx.log)
    if resumed := jobs.resumed_from(save_dir):  # the updates a run cut short (a kill, a preemption) resumed from
        result["resumed_from"] = resumed
    return result | _evaluate(ctx, prepared, bin_dir, checkpoint, evaluation | {"splits": splits}, nat_family, tgt)


def _vocab_size(prepared: PreparedCorpus) -> int:
    from fairseq.data import Dictionary

    return len(Dictionary.load(str(prepared.bin.dictionary(prepared.language_pair()[0]))))


def kept_hypotheses(work: Path, result: dict) -> Kept:
    """What a store keeps of a training: its hypotheses, which the results compare line by line; never the
    checkpoint."""
    return Kept([Path(p).relative_to(work) for key, p in sorted(result.items()) if key.endswith("_hypotheses")])


SET_FOLDER = "data"  # a set-making step's set, in its work folder


def kept_set(work: Path, result: dict) -> Kept:
    """What a store keeps of a distilled set: its own files (the targets as text and pieces, meta.json, the
    per-line scores, the card); its source side, which is the prepared corpus's, and bin/ are rebuilt
    (``rebuild_set``)."""
    folder = DistilledSet(result["dir"])
    meta = folder.meta()
    source = {folder.text(meta["split"], meta["source_lang"]), folder.pieces(meta["split"], meta["source_lang"])}
    files = [p for p in sorted(folder.root.rglob("*")) if p.is_file()]
    rebuilt = [p for p in files if p in source or folder.bin.root in p.parents]
    return Kept([p.relative_to(work) for p in files if p not in rebuilt], [p.relative_to(work) for p in rebuilt])


def rebuild_set(work: Path, results: dict, *, prepare: str) -> None:
    """A restored set's source side, copied from the prepared corpus, and its bin/, binarized from its pieces
    with the corpus's dictionaries as the generator binarizes them (the store checks both by digest)."""
    import shutil

    from nat_kd.distill.output import binarize, copy_other_splits

    prepared, folder = PreparedCorpus(results[prepare]["dir"]), DistilledSet(work / SET_FOLDER)
    meta = folder.meta()
    split, src, tgt = meta["split"], meta["source_lang"], meta["target_lang"]
    shutil.copyfile(prepared.raw(split, src), folder.text(split, src))
    shutil.copyfile(prepared.pieces(split, src), folder.pieces(split, src))
    left_out = {line - 1 for line in meta["files"].get("binarized_left_out_lines", [])}

    def binarized(lines: list[str]) -> list[str]:
        return [line for i, line in enumerate(lines) if i not in left_out]

    binarize(folder.bin.root, split, src, tgt, prepared.bin.root, None,
             binarized(read_lines(folder.pieces(split, tgt))),
             source_pieces=binarized(read_lines(folder.pieces(split, src))))
    copy_other_splits(prepared.bin.root, folder.bin.root, split, src, tgt)


def kept_selection(work: Path, result: dict) -> Kept:
    """What a store keeps of a Selective KD set: its meta.json and its evaluator's accuracies, the one thing the
    evaluator's checkpoint made; the distilled set's files and the raw targets beside them are rebuilt
    (``rebuild_selection``)."""
    folder = DistilledSet(result["dir"])
    keep = {folder.meta_file, *map(Path, result["outputs"])}
    files = [p for p in sorted(folder.root.rglob("*")) if p.is_file()]
    return Kept([p.relative_to(work) for p in files if p in keep], [p.relative_to(work) for p in files if p not in keep])


def rebuild_selection(work: Path, results: dict, *, of: str, prepare: str) -> None:
    """A restored Selective KD set's other files, from the distilled set it was made from and the corpus."""
    from nat_kd.selective_kd import rebuild

    rebuild(work / SET_FOLDER, results[of]["dir"], results[prepare]["dir"])


def distil_step(ctx: StepContext, *, prepare: str, teacher: str, strategy: str, decoding: dict, max_tokens: int,
                name: str, tgt: str) -> dict:
    prepared = Path(ctx.results[prepare]["dir"])
    out = DistilledSet(ctx.work / SET_FOLDER)
    meta = jobs.distil(prepared, Path(ctx.results[teacher]["checkpoint"]), out.root, strategy=strategy,
                       decoding=decoding, max_tokens=max_tokens, log=ctx.log, threads=ctx.threads, fp16=ctx.fp16,
                       device=ctx.device)
    if ctx.results[teacher].get("valid_bleu") is not None:  # the generator cannot know it; the card names it
        from nat_kd.analysis.card import refresh_card

        refresh_card(out.root, teacher_valid_bleu=ctx.results[teacher]["valid_bleu"])
    return {"dir": str(out.root), "name": name, "strategy": strategy, "teacher": teacher,
            "outputs": [str(out.text("train", tgt))], "sentences": meta["sentences"],
            "bleu_vs_reference": meta["scores"].get("bleu"),
            "sentences_per_second": meta["timing"]["sentences_per_second"]}


def mix_step(ctx: StepContext, *, prepare: str, of: str, rule: dict, name: str, tgt: str) -> dict:
    """nat_kd.mix: the distilled set ``of`` with the lines its rule picks taking the real target; a judge rule's
    judge is a student step of the study, whose checkpoint judges the lines."""
    from nat_kd.mix import MixRule, mix

    out = DistilledSet(ctx.work / SET_FOLDER)
    if rule.get("judge"):
        rule = {**rule, "judge": ctx.results[rule["judge"]]["checkpoint"]}
    meta = mix(ctx.results[of]["dir"], out.root, MixRule(**rule), prepared=ctx.results[prepare]["dir"], name=name)
    source = ctx.results[of]
    return {"dir": str(out.root), "name": name, "strategy": f"{source['strategy']}+mix", "teacher": source["teacher"],
            "rule": meta["mix"]["rule"], "replaced": meta["mix"]["replaced"], "lines": meta["mix"]["lines"],
            "outputs": [str(out.text("train", tgt))], "sentences": meta["sentences"],
            "bleu_vs_reference": meta["scores"].get("bleu")}


def references_step(ctx: StepContext, *, prepare: str, sets: list[str], union: bool, name: str, tgt: str,
                    criterion: dict | None = None) -> dict:
    """nat_kd.references: the distilled sets ``sets`` as one set of several references a sentence, which the
    students train on with ``criterion``'s multi_reference_nat_loss settings (ReferencesSpec.criterion), or
    with ``union`` their pairs one after the other."""
    from nat_kd.distill.references import build, reference_file

    out = DistilledSet(ctx.work / SET_FOLDER)
    split = DistilledSet(ctx.results[sets[0]]["dir"]).meta()["split"]
    meta = build([ctx.results[s]["dir"] for s in sets], out.root, union=union, name=name,
                 reference=PreparedCorpus(ctx.results[prepare]["dir"]).raw(split, tgt))
    record = meta["union" if union else "references"]
    texts = [out.text(split, tgt)] + ([] if union else [reference_file(out.root, split, tgt, k)
                                                         for k in range(2, len(sets) + 1)])
    return {"dir": str(out.root), "name": name, "strategy": "union" if union else "multi-reference",
            "teacher": ctx.results[sets[0]]["teacher"], "outputs": [str(t) for t in texts],
            "sentences": meta["sentences"], "bleu_vs_reference": meta.get("scores", {}).get("bleu"),
            "mean_pairwise_bleu": record["mean_pairwise_bleu"],
            **({} if union else {"criterion": criterion})}


def selective_kd_step(ctx: StepContext, *, prepare: str, of: str, selective_kd: dict, name: str) -> dict:
    """nat_kd.selective_kd: the distilled set ``of`` with its raw targets and the accuracy on each of the
    evaluator (a student step of the study, ``selective_kd["evaluator"]``); its students train with the
    threshold settings of ``selective_kd`` (the rest)."""
    out = DistilledSet(ctx.work / SET_FOLDER)
    settings = dict(selective_kd)
    evaluator = ctx.results[settings.pop("evaluator")]["checkpoint"]
    # a job of its own, as the study's other model jobs: the evaluator's passes on the step's threads
    jobs.run_logged("nat_kd.selective_kd", ["--distilled", ctx.results[of]["dir"], "--prepared",
                                            ctx.results[prepare]["dir"], "--evaluator", evaluator, "--out", out.root,
                                            "--name", name], ctx.log, ctx.threads)
    meta = out.meta()
    record, source = meta["selective_kd"], ctx.results[of]
    return {"dir": str(out.root), "name": name, "strategy": meta["strategy"], "teacher": source["teacher"],
            "selective_kd": settings, "mean_accuracy": record["mean_accuracy"],
            "outputs": [str(out.root / record["accuracy_file"])], "sentences": meta["sentences"],
            "bleu_vs_reference": source.get("bleu_vs_reference")}


def _turns(systems: list[str], round_: int) -> list[str]:
    """The order in which timed systems take their turn in a round: reversed every other round, so that
    neither a change in the machine's load nor a cache warmed by the one before favours a system."""
    return systems if round_ % 2 else systems[::-1]


def _median_ratio(runs: list[dict], rate: str, system: str, baseline: str, *, group: str, **match) -> float:
    """The median over rounds of ``system``'s rate divided by ``baseline``'s in the same round (machines
    differ in speed, and one machine's load drifts, so only ratios taken side by side are compared)."""

    def by_round(name):
        return {r["round"]: r[rate] for r in runs if r[group] == name and all(r[k] == v for k, v in match.items())}

    mine, base = by_round(system), by_round(baseline)
    return statistics.median(mine[k] / base[k] for k in sorted(mine))


def speed_step(ctx: StepContext, *, prepare: str, systems: dict, batchings: list[str], repeats: int,
               evaluation: dict, tgt: str) -> dict:
    """Test-set decoding speed on one thread: every system decodes the test set with every batching,
    ``repeats`` rounds, the systems taking turns (see ``_turns``). Speed is fairseq-generate's own count
    (sentences over the time spent generating, model loading excluded); speedups are ``_median_ratio``s."""
    prepared = PreparedCorpus(ctx.results[prepare]["dir"])
    references = read_lines(prepared.raw("test", tgt))
    runs, bleu = [], {}
    for round_ in range(1, repeats + 1):
        for batching in batchings:
            kind, size = batching.split(":")
            for label in _turns(list(systems), round_):
                system = systems[label]
                hypotheses = ctx.work / f"{label.replace(' ', '_')}.{kind}{size}.hyp"
                settings = {k: v for k, v in evaluation.items() if k != "splits"}
                settings |= {"beam": system.get("beam", settings["beam"])}
                if kind == "tokens":
                    settings["max_tokens"] = int(size)
                lines = jobs.translate(prepared.bin.root, Path(ctx.results[system["step"]]["checkpoint"]), "test",
                                       hypotheses, log=ctx.log, threads=1, nat_family=system.get("nat_family"),
                                       tokenization=prepared.tokenization(), languages=prepared.language_pair(),
                                       batch_size=int(size) if kind == "sentences" else None, device=ctx.device,
                                       **settings)
                timing = jobs.generation_speed(ctx.log)
                runs.append({"system": label, "batching": batching, "round": round_, **timing})
                bleu[f"{label}|{batching}"] = jobs.bleu(lines, references)["bleu"]
    baseline = next(iter(systems))
    speedup = {f"{label}|{batching}": round(_median_ratio(runs, "sentences_per_second", label, baseline,
                                                          group="system", batching=batching), 2)
               for batching in batchings for label in systems}
    return {"systems": systems, "baseline": baseline,
            "runs": runs, "bleu": bleu, "speedup": speedup, "outputs": []}


def training_speed_step(ctx: StepContext, *, prepare: str, data: str | None, families: list[str], shape: dict,
                        training: dict, updates: int, repeats: int) -> dict:
    """fairseq-train's updates/s for each family from scratch, one thread, ``repeats`` rounds, the families
    taking turns (see ``_turns``); each ratio to the first family is a ``_median_ratio``."""
    prepared = PreparedCorpus(ctx.results[prepare]["dir"])
    bin_dir = (DistilledSet(ctx.results[data]["dir"]).bin if data else prepared.bin).root
    runs = []
    for round_ in range(1, repeats + 1):
        for family in _turns(families, round_):
            ups = jobs.training_speed(bin_dir, ctx.work / family, arch=student_arch(family), shape=ModelSize(**shape),
                                      training=Training(**training), nat_family=family, updates=updates,
                                      interval=TRAINING_SPEED_INTERVAL, log=ctx.log, device=ctx.device)
            runs.append({"family": family, "round": round_, "updates_per_second": ups})
    baseline = families[0]
    ratio = {family: round(_median_ratio(runs, "updates_per_second", family, baseline, group="family"), 3)
             for family in families}
    return {"families": families, "baseline": baseline, "updates": updates, "runs": runs, "ratio": ratio,
            "outputs": []}


def analysis_step(ctx: StepContext, *, prepare: str, sets: list[str], src: str, tgt: str, out: str,
                  details: dict | None = None) -> dict:
    from nat_kd.analysis.report import AnalysisReport, DataSet, DetailedAnalysisReport
    from nat_kd.analysis.tokenizers import get_tokenizer

    prepared = PreparedCorpus(ctx.results[prepare]["dir"])
    real = DataSet("real", prepared.raw("train", src), prepared.raw("train", tgt), "reference")
    sets_read = [(ctx.results[s], DistilledSet(ctx.results[s]["dir"])) for s in sets]
    distilled = [DataSet(result["name"], folder.text("train", src), folder.text("train", tgt), result["strategy"],
                         real_repeats=folder.real_repeats()) for result, folder in sets_read]
    tokenizer = get_tokenizer("13a", lowercase=True)
    if details:
        analyser = DetailedAnalysisReport(tokenizer, drop_empty=True, buckets=details["buckets"],
                                          floors=details["floors"], interpolation=details["interpolation"],
                                          repeat_n=details["repeat_n"])
    else:
        analyser = AnalysisReport(tokenizer, drop_empty=True)
    report = analyser.run(real, distilled)
    paths = report.write(Path(out))
    return {"rows": report.rows, "signature": report.signature, "outputs": [str(paths["json"])]}


def modes_step(ctx: StepContext, *, prepare: str, systems: dict, distilled: str, src: str) -> dict:
    """The multi-modality diagnostic: the language mix of each system's test outputs and of the real and the
    distilled training targets, under unigram models of each target language's real training text."""
    from nat_kd.analysis.metrics import Modes, UnigramModels
    from nat_kd.analysis.tokenizers import get_tokenizer

    prepared = PreparedCorpus(ctx.results[prepare]["dir"])
    tokenizer = get_tokenizer("13a", lowercase=True)
    targets = read_lines(prepared.raw("train", "mix"))
    langs = read_lines(prepared.languages_file("train"))
    texts = {}
    for line, lang in zip(targets, langs):
        texts.setdefault(lang, []).append(line)
    modes = Modes(UnigramModels.from_texts({lang: tokenizer.corpus(lines) for lang, lines in texts.items()}))
    distilled_targets = DistilledSet(ctx.results[distilled]["dir"]).text("train", "mix")
    outputs = {"real training targets": targets, "distilled training targets": read_lines(distilled_targets)}
    outputs |= {label: read_lines(ctx.results[step]["test_hypotheses"]) for label, step in systems.items()}
    rows = []
    for label, lines in outputs.items():
        score = modes.corpus_score(tokenizer.corpus(lines), tokenizer.settings)
        rows.append({"name": label, "mode_purity": score.mean_purity, "mode_mix": score.mix,
                     "argmax_share": score.argmax_share, "unknown": score.unknown,
                     "test_bleu": ctx.results[systems[label]]["test_bleu"] if label in systems else None})
    return {"rows": rows, "languages": list(texts), "signature": str(score.signature), "outputs": []}


def training_settings(training: Training, nat_family: str | None) -> dict:
    """A training step's ``training`` settings: only what the model reads (``Training.used_by``); the glancing
    schedule only when it is not the default, so that the steps of studies made before it was configurable keep
    their fingerprints."""
    return {k: v for k, v in asdict(training.used_by(nat_family)).items() if k != "glance_anneal_updates" or v}


def settings_as_read(kind: str, settings: dict) -> dict:
    """A step's settings as its work reads them, for matching a record made before a setting its model never
    reads was left out of the settings (a vanilla NAT's glancing schedule, the label smoothing of a loss that
    has none): such a record is of the same training (steps.Runner's ``canonical``)."""
    if kind != "train" or "training" not in settings:
        return settings
    return {**settings, "training": training_settings(Training(**settings["training"]), settings.get("nat_family"))}
