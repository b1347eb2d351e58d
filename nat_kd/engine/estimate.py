"""How long a step is expected to run (``python -m nat_kd.study --hours``), from the finished steps' records of
the same kind and shape: the study's own, its store's and those of the committed results it reuses.

A training's rate is its seconds an update (its validation and test decoding included), times the updates
its budget has left; where its record's wall time is shorter than its learning curve's training time (the run
that wrote the record only evaluated a training an earlier run had finished), the curve's time. A distilled
set's, seconds a sentence times the training pairs; any other step's, the wall time of the step of the same
name. Records taken with the same torch threads are preferred; a step with
no such record has no estimate. A begun training whose learning curve timed its last chunk goes by that
chunk's seconds an update instead: measured on this machine, where the records may come from faster ones.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def _key(kind: str, settings: dict, shape_of) -> tuple | None:
    """What makes two steps' rates alike; ``shape_of(step_name)``: that step's model shape, or None."""
    if kind == "train":
        training = settings["training"]
        return ("train", settings["arch"], json.dumps(settings.get("shape"), sort_keys=True),
                settings.get("nat_family"), training.get("max_tokens"), training.get("bleu_every"))
    if kind == "distil":
        return ("distil", json.dumps(shape_of(settings["teacher"]), sort_keys=True), settings["strategy"],
                json.dumps(settings["decoding"], sort_keys=True), settings["max_tokens"])
    return None


def _rate(record: dict) -> float | None:
    """Seconds an update (a training), a sentence (a distilled set), or the step (any other)."""
    result, seconds = record["result"], record.get("wall_seconds")
    if seconds is None:
        return None
    if record["kind"] == "train":
        seconds = max(seconds, sum(point.get("train_seconds") or 0 for point in result.get("curve") or ()))
        updates = result.get("updates_trained") or record["settings"]["training"]["updates"]
        return seconds / updates if updates else None
    if record["kind"] == "distil":
        return seconds / result["sentences"] if result.get("sentences") else None
    return seconds


class Estimates:
    """Rates from ``sources``, each a {step name: record} of one study, at ``threads`` torch threads a step."""

    def __init__(self, sources: list[dict[str, dict]], threads: int):
        self.threads = threads
        self.rates: dict[tuple, list[tuple[bool, float]]] = {}
        for records in sources:
            def shape_of(name, records=records):
                return records.get(name, {}).get("settings", {}).get("shape")

            for name, record in records.items():
                rate = _rate(record)
                key = _key(record["kind"], record["settings"], shape_of) or (record["kind"], name)
                if rate is not None:
                    self.rates.setdefault(key, []).append((record.get("threads", 1) == threads, rate))

    def seconds(self, name: str, kind: str, settings: dict, records: dict, work: Path) -> float | None:
        """The expected wall time of step ``name`` on its dependencies' ``records``; None without a record to
        go by. A begun training counts only the updates its work folder has still to train."""
        def shape_of(step):
            return records.get(step, {}).get("settings", {}).get("shape")

        key = _key(kind, settings, shape_of) or (kind, name)
        found = self.rates.get(key, [])
        alike = [rate for same, rate in found if same] or [rate for _, rate in found]
        if kind == "train":
            done, measured = _curve_rate(work)
            rate = measured or (statistics.median(alike) if alike else None)
            return None if rate is None else rate * max(0, settings["training"]["updates"] - done)
        if not alike:
            return None
        rate = statistics.median(alike)
        if kind == "distil":
            pairs = records.get(settings["prepare"], {}).get("result", {}).get("train_pairs")
            return rate * pairs if pairs else None
        return rate


def _curve_rate(work: Path) -> tuple[int, float | None]:
    """A begun training's updates so far, and its last timed chunk's seconds an update (None: none timed)."""
    done, rate = 0, None
    for path in sorted(work.rglob("curve.json")) if work.is_dir() else []:
        curve = sorted(json.loads(path.read_text(encoding="utf-8")), key=lambda point: point["updates"])
        if curve and curve[-1]["updates"] > done:
            done = curve[-1]["updates"]
            before = curve[-2]["updates"] if len(curve) > 1 else 0
            seconds = curve[-1].get("train_seconds")
            rate = seconds / (done - before) if seconds and done > before else None
    return done, rate


def hours(seconds: float | None) -> str:
    """An estimate for people: '1.4 h', '12 min', or 'unknown'."""
    if seconds is None:
        return "unknown"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{max(1, round(seconds / 60))} min"
