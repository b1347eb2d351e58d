"""Pilot students: does a short training rank the training sets as the full one does?

Every student trained with a validation-BLEU curve (curve.py) holds its pilots already: the curve's point at
N updates is the validation BLEU of a pilot trained N updates with the same recipe (the learning rate and the
glancing schedule do not depend on the budget; only the grouping of sentences into batches after a resumed
chunk's first epoch is another draw, docs/study.md "Learning curves"). For each study
and student family, the sets' validation BLEU at N updates is ranked against their final test BLEU (Spearman,
with central_table.spearman's permutation p) and the pilot's pick (its best set) is compared with the final
best: the "regret" is the final test BLEU lost by training on the pilot's pick.

Command line: ``python -m nat_kd.study.pilots RESULTS.json [...] --json OUT.json --markdown OUT.md`` over the
results.json of finished studies; ``nat_kd.choose`` reads the JSON it writes (AGREEMENT, in this package).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from nat_kd import atomic
from nat_kd.cli import add_verbose_argument, run, setup_logging
from nat_kd.errors import NatKdError
from nat_kd.markdown import cell, table

from nat_kd.engine.curve import bleu_at

PILOT_UPDATES = (250, 500, 1000, 1500)
# Pilots whose best validation BLEU is below this have not learned yet: in the committed studies every student
# below it at least doubled its validation BLEU over the next 250 updates (``take_off``), so their order is the
# order in which they got off the ground, not the sets'. Vanilla NAT's pilots of 250 updates (best 2.2 to 2.3)
# missed the final best set in both studies that measured them.
LEARNED_BLEU = 5.0
AGREEMENT = Path(__file__).with_name("pilot_agreement.json")  # the committed studies' agreement, for nat_kd.choose


def students(records: dict[str, dict]):
    """(family, shape, training set label, seed, result) of every student with a learning curve in a study's step
    records (the label is the distilled set's name, or "real"; the shape LAYERSxWIDTH); students of other
    corpora (the multi-modality experiment) are left out."""
    from nat_kd.engine.steps import shape_label

    for record in records.values():
        settings, result = record.get("settings", {}), record.get("result", {})
        if (record.get("kind") != "train" or not settings.get("nat_family") or settings.get("prepare") != "prepare"
                or "curve" not in result or result.get("test_bleu") is None):
            continue
        data = settings.get("data")
        label = "real" if data is None else records.get(data, {}).get("result", {}).get("name", data)
        yield (settings["nat_family"], shape_label(settings["arch"], settings.get("shape")), label,
               settings.get("seed", 1), result)


def students_by_family(records: dict[str, dict]) -> dict[tuple[str, str], dict[str, dict]]:
    """(family, shape) -> training set label -> the result of its seed-1 student (the seed that ranks the sets)."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for family, shape, label, seed, result in students(records):
        if seed == 1:
            out.setdefault((family, shape), {})[label] = result
    return out


def take_off(records: dict[str, dict], step: int = 250) -> list[tuple[float, float]]:
    """(validation BLEU, its growth over the next ``step`` updates as a ratio) at every point of every student's
    learning curve with a point ``step`` updates later: how fast students still learn at each BLEU."""
    out = []
    for _, _, _, _, result in students(records):
        curve = result["curve"]
        for here, later in zip(curve, curve[1:]):
            if later["updates"] - here["updates"] == step and here["valid_bleu"] > 0:
                out.append((here["valid_bleu"], later["valid_bleu"] / here["valid_bleu"]))
    return out


def seed_noise(study: str, records: dict[str, dict], budgets=PILOT_UPDATES) -> list[dict]:
    """How far a pilot's validation BLEU moves with the seed alone: one row per family, shape and budget at which
    some set's student was trained with several seeds, the variance of each such set's pilots over its seeds
    pooled by degrees of freedom (``sd``, with ``df`` for pooling rows further)."""
    curves: dict[tuple[str, str], dict[str, list]] = {}
    for family, shape, label, _, result in students(records):
        curves.setdefault((family, shape), {}).setdefault(label, []).append(result["curve"])
    rows = []
    for (family, shape), sets in sorted(curves.items()):
        for updates in budgets:
            squares, df, measured = 0.0, 0, 0
            for seeds in sets.values():
                values = [v for curve in seeds if (v := bleu_at(curve, updates)) is not None]
                if len(values) > 1:
                    mean = sum(values) / len(values)
                    squares += sum((v - mean) ** 2 for v in values)
                    df, measured = df + len(values) - 1, measured + 1
            if df:
                rows.append({"study": study, "family": family, "shape": shape, "updates": updates, "sets": measured,
                             "df": df, "sd": round(math.sqrt(squares / df), 4)})
    return rows


def noise_for(family: str, shape: str, updates: int, path: Path = AGREEMENT) -> dict | None:
    """The pilots' seed noise of ``family`` at ``shape`` at the longest budget of at most ``updates``, pooled
    over the committed studies: {"updates", "sd", "sets"}; None where none was measured."""
    rows = [r for r in json.loads(path.read_text(encoding="utf-8")).get("noise", [])
            if r["family"] == family and r["shape"] == shape and r["updates"] <= updates]
    if not rows:
        return None
    longest = max(r["updates"] for r in rows)
    rows = [r for r in rows if r["updates"] == longest]
    df = sum(r["df"] for r in rows)
    return {"updates": longest, "sd": math.sqrt(sum(r["sd"] ** 2 * r["df"] for r in rows) / df),
            "sets": sum(r["sets"] for r in rows)}


def agreement(study: str, records: dict[str, dict], budgets=PILOT_UPDATES) -> list[dict]:
    """One row per family, shape and pilot budget with at least MIN_SETS_FOR_CORRELATION sets measured there."""
    from .central_table import MIN_SETS_FOR_CORRELATION, spearman  # imports fairseq (after the logging set-up)

    rows = []
    for (family, shape), students in sorted(students_by_family(records).items()):
        final = {label: r["test_bleu"] for label, r in students.items()}
        for updates in budgets:
            # the sets measured at this budget (a student stopped early has no later point): the pilot picks
            # among them, and its pick is judged against the best of them
            pilot = {label: v for label, r in students.items() if (v := bleu_at(r["curve"], updates)) is not None}
            if len(pilot) < MIN_SETS_FOR_CORRELATION:
                continue
            labels = sorted(pilot)
            rho, p = spearman([pilot[x] for x in labels], [final[x] for x in labels])
            pick, best = max(labels, key=pilot.get), max(labels, key=final.get)
            rows.append({"study": study, "family": family, "shape": shape, "sets": len(labels), "updates": updates,
                         "rho": None if math.isnan(rho) else round(rho, 4), "p": None if math.isnan(p) else p,
                         "pick": pick, "final_best": best, "regret": round(final[best] - final[pick], 2),
                         "final_updates": max(r["updates_trained"] for r in students.values())})
    return rows


def markdown(rows: list[dict]) -> str:
    from .central_table import p_value_cell

    return table(["study", "student", "shape", "sets", "pilot updates", "Spearman rho", "p (two-sided)",
                  "pilot's pick", "final best", "test BLEU lost"],
                 [[r["study"], r["family"], r["shape"], r["sets"], f"{r['updates']:,}", cell(r["rho"], "+.3f"),
                   p_value_cell(float("nan") if r["p"] is None else r["p"]), r["pick"], r["final_best"],
                   cell(r["regret"], ".2f")] for r in rows])


def measured(family: str, shape: str, path: Path = AGREEMENT) -> list[dict]:
    """The committed studies' rows for pilots of ``family`` at ``shape`` (LAYERSxWIDTH)."""
    return [r for r in json.loads(path.read_text(encoding="utf-8"))["rows"]
            if r["family"] == family and r["shape"] == shape]


def for_family(family: str, shape: str, updates: int, path: Path = AGREEMENT) -> tuple[list[dict], list[int]]:
    """The measured agreement of ``family``'s pilots at ``shape`` at the longest budget of at most ``updates``,
    one row a study, and every budget measured for them (both empty where no study measured it)."""
    rows = measured(family, shape, path)
    out = []
    for study in dict.fromkeys(r["study"] for r in rows):
        fitting = [r for r in rows if r["study"] == study and r["updates"] <= updates]
        if fitting:
            out.append(max(fitting, key=lambda r: r["updates"]))
    return out, sorted({r["updates"] for r in rows})


def picked_the_best(rows: list[dict]) -> bool:
    """Whether pilots ranked the sets as full training did where it counts: each study's pick is its final best."""
    return bool(rows) and all(r["regret"] == 0 for r in rows)


def trusted_budget(family: str, shape: str, path: Path = AGREEMENT) -> int | None:
    """The shortest pilot budget at which every committed study that measured ``family`` at ``shape`` there saw
    the pilots pick the final best set; None if none did."""
    rows = measured(family, shape, path)
    for updates in sorted({r["updates"] for r in rows}):
        if picked_the_best([r for r in rows if r["updates"] == updates]):
            return updates
    return None


def main(argv=None) -> int:
    setup_logging(argv)
    p = argparse.ArgumentParser(prog="python -m nat_kd.study.pilots", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="a finished study's results.json (its results folder's)")
    p.add_argument("--updates", type=int, nargs="+", default=list(PILOT_UPDATES), help="pilot budgets")
    p.add_argument("--json", type=Path, help="write the rows here (nat_kd.choose reads " + str(AGREEMENT.name) + ")")
    p.add_argument("--markdown", type=Path, help="write the table here")
    add_verbose_argument(p)
    args = p.parse_args(argv)

    def go() -> int:
        rows, noise, sources = [], [], []
        for path in map(Path, args.results):
            try:
                results = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as err:
                raise NatKdError(f"{path}: {err}; give a study's results/results.json") from None
            if "steps" not in results or "profile" not in results:
                raise NatKdError(f"{path}: no 'profile' and 'steps': not a study's results.json")
            rows += agreement(results["profile"], results["steps"], args.updates)
            noise += seed_noise(results["profile"], results["steps"], args.updates)
            sources.append(path.as_posix())
        text = markdown(rows)
        if args.json:
            atomic.write_json(args.json, {"sources": sources, "rows": rows, "noise": noise})
        if args.markdown:
            atomic.write_text(args.markdown, text)
        print(text, end="")
        return 0

    return run(go)


if __name__ == "__main__":
    sys.exit(main())
