"""The page of the distilled sets a study's store keeps (STORE/distilled_sets.md), written with the study's
results: for each set in STORE/kept/, the teacher that made it (shape, training, BLEU, its checkpoint's sha256,
though the checkpoint itself is never kept), the decoding, the set's measures and card, the archive, and the
commands that restore it into a study folder and train a student on it without the teacher.

From the store's own records and archives only, so the page says what a clone of the repository holds.
"""
from __future__ import annotations

import io
import json
import lzma
import tarfile
from dataclasses import replace
from pathlib import Path

from nat_kd import atomic
from nat_kd.analysis.metrics import shown
from nat_kd.analysis.metrics.base import DECODING
from nat_kd.engine.fairseq_jobs import train_args
from nat_kd.engine.steps import SET_FOLDER, student_arch, student_step
from nat_kd.engine.store import Store
from nat_kd.markdown import cell, table

from .config import StudyConfig
from .plan import analysis_result

PAGE = "distilled_sets.md"


def _card(store: Store, record: dict) -> dict:
    """The set's card.json, read from its archive (an archive without one: {})."""
    data = lzma.decompress(store.archive_file(record["name"]).read_bytes())
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        try:
            member = tar.extractfile(f"{SET_FOLDER}/card.json")
        except KeyError:
            return {}
        return json.loads(member.read().decode("utf-8"))


def kept_sets(store: Store, teachers: tuple[str, ...] = ()) -> list[dict]:
    """The store's distilled sets that have an archive, in the order of their teachers' size (parameters), then
    of ``teachers`` (the teachers' step names in the profile's order: seeds 1, 2, 3 of one shape); one whose
    archive is not there (not committed yet, or deleted) is left out."""
    records = store.records()
    analysis = analysis_result({name: record["result"] for name, record in records.items()}) or {}
    rows = {row["name"]: row for row in analysis.get("rows", [])}
    sets = []
    for name, record in records.items():
        kept = record.get("kept") or {}
        if record["kind"] != "distil" or not kept.get("archive") or not store.archive_file(name).is_file():
            continue
        teacher = records.get(record["settings"]["teacher"], {})
        sets.append({"step": name, "record": record, "teacher": teacher, "card": _card(store, record),
                     "analysis": rows.get(record["result"]["name"], {}),
                     "bytes": store.archive_file(name).stat().st_size})
    def order(s):
        teacher = s["record"]["settings"]["teacher"]
        return (s["teacher"].get("result", {}).get("parameters") or 0,
                teachers.index(teacher) if teacher in teachers else len(teachers), s["step"])

    return sorted(sets, key=order)


def kept_selections(store: Store) -> list[dict]:
    """The store's Selective KD steps that have an archive (their evaluator's accuracy on each line), by name;
    each with its record and its evaluator's."""
    records = store.records()
    return [{"step": name, "record": record, "bytes": store.archive_file(name).stat().st_size,
             "evaluator": records.get(record["settings"]["selective_kd"]["evaluator"], {})}
            for name, record in sorted(records.items())
            if "selective_kd" in record.get("settings", {}) and (record.get("kept") or {}).get("archive")
            and store.archive_file(name).is_file()]


def _selections(cfg: StudyConfig, selections: list[dict], shown_store: str, profile: str) -> list[str]:
    """The page's section on the kept Selective KD steps; [] where there is none."""
    if not selections:
        return []
    rows = []
    for s in selections:
        record, evaluator = s["record"], s["evaluator"]
        thresholds = {k: v for k, v in record["settings"]["selective_kd"].items() if k != "evaluator"}
        rows.append([f"`{s['step']}`", f"`{record['settings']['of']}`",
                     f"`{record['settings']['selective_kd']['evaluator']}`",
                     cell(evaluator.get("result", {}).get("test_bleu"), ".2f"),
                     cell(record["result"].get("sentences"), ","), cell(record["result"].get("mean_accuracy"), ".3f"),
                     ", ".join(f"{k} {v:g}" for k, v in sorted(thresholds.items())),
                     f"[{s['bytes'] / 2**20:.2f} MB](kept/{s['step']}.tar.xz)"])
    example = selections[0]
    label = example["record"]["result"]["name"]
    families = [f for f in cfg.student_families if label in cfg.sets_of(f)]
    return [
        "## Selective KD's per-line accuracies\n",
        "Selective KD (Liu et al., AAAI 2023) trains each line on its distilled or its raw target, by its evaluator's "
        "accuracy on the raw target against a threshold that rises over the training (docs/students.md). The "
        "accuracies are kept, one a line (`data/bin/train.evaluator_accuracy.txt` in the archive, with its "
        "meta.json); the rest, the distilled set with the raw targets beside it, is made again from the set and "
        "the corpus, so neither the teacher nor the evaluator trains again.\n",
        table(["selection", "made from", "evaluator", "evaluator test BLEU", "lines", "mean accuracy",
               "threshold", "archive"], rows),
        "Restore it (with its distilled set and the corpus):\n",
        "```bash",
        f"python -m nat_kd.study {profile} --out STUDY --store {shown_store} --only {example['step']}",
        "```\n",
        f"The set is then `STUDY/work/{example['step']}/{SET_FOLDER}/`"
        + (f"; the study's students on it: {', '.join(f'`--only {student_step(f, label)}`' for f in families)}."
           if families else "."),
        "",
    ]


def _shape(settings: dict) -> str:
    shape = settings.get("shape") or {}
    if not shape:
        return "-"
    return (f"{shape['layers']}x{shape['embed_dim']}, ffn {shape['ffn_dim']}, {shape['heads']} heads"
            + (f", dropout {shape['dropout']:g}" if shape.get("dropout") is not None else ""))


def _training(teacher: dict) -> str:
    result, training = teacher.get("result", {}), teacher.get("settings", {}).get("training", {})
    if not result:
        return "-"
    stop = (f"stopped early at {result['updates_trained']:,}" if result.get("stopped_early")
            else f"{result.get('updates_trained', training.get('updates', 0)):,} updates (the budget)")
    return (f"{stop}, best at {result.get('best_updates', 0):,}; lr {training.get('lr', 0):g}, warm-up "
            f"{training.get('warmup', 0):,}, {training.get('max_tokens', 0):,} tokens a batch, BLEU every "
            f"{training.get('bleu_every', 0):,} updates, patience {training.get('patience', 0)}")


def _decoding(card: dict) -> str:
    decoding = card.get("decoding") or {}
    if not decoding:
        return "-"
    backend = decoding.get("backend", {})
    settings = ", ".join(f"{k}={v}" for k, v in sorted(decoding.get("settings", {}).items()) if k != "name")
    return f"`{decoding.get('strategy')}` by {backend.get('name')} ({settings})"


def _student_command(cfg: StudyConfig, family: str, bin_dir: str) -> str:
    """fairseq-train as the study runs a student of ``family`` on the set in ``bin_dir``, in one run that keeps
    fairseq's best validation loss (the study trains it in chunks and keeps the best validation BLEU)."""
    root = Path(__file__).resolve().parents[2]
    argv = train_args(Path(bin_dir), Path("SAVE_DIR"), arch=student_arch(family), shape=cfg.student_shape,
                      training=replace(cfg.student_training, bleu_every=0, patience=0), nat_family=family)
    words = ["fairseq-train"] + [str(a).replace(str(root) + "/", "") for a in argv]
    return " ".join(f"'{w}'" if " " in w else w for w in words)


def _example(cfg: StudyConfig, sets: list[dict]) -> tuple[dict, str | None]:
    """The set the page's commands use, and the family whose step trains on it: the first set that one of the
    study's families learns from, so that `--only` names a step of the plan; else the first set and no step."""
    for s in sets:
        for family in cfg.student_families:
            if s["record"]["result"]["name"] in cfg.sets_of(family):
                return s, family
    return sets[0], None


def _students(cfg: StudyConfig, kept: dict, step_family: str | None) -> list[str]:
    family = step_family or cfg.student_families[0]
    step = student_step(family, kept["record"]["result"]["name"])
    own = (f"The study's own students train on it with `--only {step}` (one step a family and set: the names "
           "`--list` prints); or train one yourself" if step_family else "Train a student on it")
    return [f"{own}, here the study's {family} student in one run (its checkpoint chosen on validation loss):\n",
            "```bash", _student_command(cfg, family, f"STUDY/work/{kept['step']}/{SET_FOLDER}/bin"), "```\n"]


def sets_page(cfg: StudyConfig, store: Store, shown_store: str, profile: str) -> str | None:
    """The page's Markdown; None where the store keeps no set. ``shown_store``: the store as the commands write
    it; ``profile``: the study's profile or config file, as the commands name it."""
    sets = kept_sets(store, tuple(f"teacher.{t.name}" for t in cfg.teachers))
    if not sets:
        return None
    example, family = _example(cfg, sets)
    columns = shown(DECODING)
    rows = []
    for s in sets:
        record, teacher, a = s["record"], s["teacher"].get("result", {}), s["analysis"]
        rows.append([f"`{s['step']}`", record["settings"]["teacher"], cell(teacher.get("parameters"), ","),
                     cell(teacher.get("test_bleu"), ".2f"), cell(record["result"].get("sentences"), ","),
                     *(cell(a.get(m.name), column.format) for m, column in columns),
                     f"[{s['bytes'] / 2**20:.2f} MB](kept/{s['step']}.tar.xz)"])
    signatures = sorted({s["teacher"].get("result", {}).get("bleu_signature") for s in sets} - {None})
    lines = [
        f"# The distilled sets kept with the `{cfg.name}` study\n",
        f"Each set is a teacher's re-decoding of the {cfg.src}-{cfg.tgt} training pairs; its target side, its "
        "meta.json, per-line scores and dataset card are committed in [kept/](kept/) (xz-compressed tar), with "
        "their digests in [steps/](steps/). The teachers' checkpoints are not kept; each set's section "
        "below names its teacher's by sha256. The source side is the prepared corpus's, so a set is restored into a study "
        "folder of your own, where its `bin/` is binarized again and checked against the record's digests.\n",
        table(["set", "teacher", "parameters", "teacher test BLEU", "sentences",
               *(column.label for _, column in columns), "archive"], rows),
        "Teacher BLEU: sacrebleu on the study's test set, detokenized, from the checkpoint of best validation BLEU"
        + (f" (`{'`, `'.join(signatures)}`)" if signatures else "") + ". The measures: the study's analysis "
        "of the training targets (docs/analysis.md).\n",
        "## Using a set without its teacher\n",
        "Restore a set (and the corpus it pairs with) into a folder of your own; the teacher is not trained:\n",
        "```bash",
        f"python -m nat_kd.study {profile} --out STUDY --store {shown_store} --only {example['step']}",
        "```\n",
        f"The set is then `STUDY/work/{example['step']}/{SET_FOLDER}/` (its `bin/` for fairseq).",
        *(_students(cfg, example, family) if cfg.student_families else []),
        f"`--store` takes any copy of this folder (a clone's `{shown_store}`, or one unpacked elsewhere). "
        "Inside an archive: `tar -xJf kept/NAME.tar.xz` gives the targets (`data/train.LANG`, and in the teacher's "
        "pieces `data/spm/`), `data/meta.json` (how it was made) and the card (`data/CARD.md`); paths inside "
        "name the study folder as `DIR`.\n",
    ]
    lines += _selections(cfg, kept_selections(store), shown_store, profile)
    lines.append("## Each set\n")
    for s in sets:
        record, teacher, card = s["record"], s["teacher"], s["card"]
        result = teacher.get("result", {})
        against = card.get("scores_vs_reference") or {}
        checkpoint = (card.get("teacher") or {}).get("sha256") or []
        lines += [
            f"### `{s['step']}`\n",
            f"- **Teacher** `{record['settings']['teacher']}`: {_shape(teacher.get('settings', {}))}; "
            f"{cell(result.get('parameters'), ',')} parameters; validation BLEU {cell(result.get('valid_bleu'), '.2f')}, "
            f"test BLEU {cell(result.get('test_bleu'), '.2f')}; checkpoint sha256 "
            + (", ".join(f"`{c}`" for c in checkpoint) or "-") + ".",
            f"- **Training**: {_training(teacher)}.",
            f"- **Decoding**: {_decoding(card)}; {cell(record['result'].get('sentences'), ',')} sentences in "
            f"{cell(record.get('wall_seconds'), '.0f')} s ({cell(record['result'].get('sentences_per_second'), '.1f')} "
            f"sentences/s, {record.get('threads', '-')} torch thread(s)).",
            f"- **Against the real targets**: BLEU {cell(against.get('bleu'), '.2f')}, chrF "
            f"{cell(against.get('chrf'), '.2f')}, length ratio {cell(against.get('length_ratio_corpus'), '.3f')}"
            + (f" (`{against['bleu_signature']}`)" if against.get("bleu_signature") else "") + ".",
            f"- **Card**: `data/CARD.md` in [kept/{s['step']}.tar.xz](kept/{s['step']}.tar.xz) "
            f"({s['bytes']:,} bytes, sha256 `{record['kept']['sha256']}`).\n",
        ]
    return "\n".join(lines)


def path_in_checkout(folder: Path, given: str) -> str:
    """``folder`` as a page committed beside it names it: relative to the top of the git checkout that holds it,
    so that the commands read the same in every clone, whatever path the study was given (``given``, kept for a
    folder outside any checkout)."""
    folder = folder.resolve()
    for top in (folder, *folder.parents):
        if (top / ".git").exists():
            return folder.relative_to(top).as_posix()
    return given


def write_sets_page(cfg: StudyConfig, store: Store, given_store: str, profile: str) -> Path | None:
    """Write STORE/distilled_sets.md (module docstring) where the store keeps a set; its path, else None.
    ``given_store``: the ``--store`` argument (path_in_checkout)."""
    text = sets_page(cfg, store, path_in_checkout(store.root, given_store), profile)
    if text is None:
        return None
    path = store.root / PAGE
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        atomic.write_text(path, text)
    return path
