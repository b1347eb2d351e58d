"""TOML settings files read into frozen dataclasses, checked before anything runs: the study's configs
(``nat_kd.study.config``) and the cluster files of the study and the generator (``nat_kd.launch.settings``).

A table becomes a dataclass by its fields: every key known (a typo would silently keep a default), every value of
its field's type (an ``int`` field refuses 1.5, a ``float`` field takes 1 as it is, ``bool`` is never a number),
every number finite (TOML allows ``inf`` and ``nan``), every list's elements of their declared type, and a field's
``metadata`` range (``least``: the smallest value allowed; ``most``: the largest; ``positive``: more than 0), each
with why where the bound is not plain. A value is kept exactly as written (1 stays 1 in a float field), since the
study's fingerprints hash the settings.
"""
from __future__ import annotations

import math
import tomllib
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path

from .errors import NatKdError


class SettingsFileError(NatKdError):
    """A settings file's problem; the message names the file, the table, the key and the fix."""


def read_toml(path: str | Path, error: type[NatKdError] = SettingsFileError) -> dict:
    """A TOML file's tables; a missing file or a syntax error is ``error`` naming the file (and the line)."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise error(f"{path}: not a text file (byte {err.start} is not UTF-8): give a TOML settings file") from None
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise error(f"{path}: {err}") from None


def least(value: float, why: str = "") -> dict:
    """A field's metadata: its value may not be below ``value`` (``why``: the reason, for the message)."""
    return {"least": value, "least_why": why}


def most(value: float, why: str = "") -> dict:
    """A field's metadata: its value may not be above ``value`` (``why``: the reason, for the message)."""
    return {"most": value, "most_why": why}


POSITIVE = {"positive": True}  # a field's metadata: its value must be more than 0


def _describe(kind) -> str:
    if kind is float:
        return "a number"
    if typing.get_origin(kind) in (list, tuple):
        return f"a list of {_describe(typing.get_args(kind)[0])}s"
    return {int: "an integer", str: "a string", bool: "true or false", dict: "a table"}.get(kind, str(kind))


def check_value(value, kind, where: str, error: type[NatKdError] = SettingsFileError):
    """``value`` checked against the type ``kind`` (int, float, str, bool, dict, X | None, tuple[X, ...],
    list[X]); returns it, a list as a tuple for a tuple field. ``where``: table.key, for the message."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        if value is None:
            return None
        kind = options[0]
    origin = typing.get_origin(kind)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise error(f"{where} = {value!r}: expected {_describe(kind)}")
        element = typing.get_args(kind)[0]
        items = [check_value(item, element, f"{where}[{i}]", error) for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise error(f"{where} = {value!r}: expected {_describe(kind)}")
    if kind in (int, float) and not math.isfinite(value):
        raise error(f"{where} = {value!r}: expected a finite number")
    return value


def dataclass_from_table(cls, table: dict, where: str, error: type[NatKdError] = SettingsFileError, **fixed):
    """``cls`` from a TOML table: each field from its key, else its default (a field without one must be
    given); ``fixed``: fields set here, not read. Refuses an unknown key, a value of the wrong type, a
    number out of its field's range: ``error`` naming ``where`` (e.g. "FILE: [resources.train]") and the key."""
    hints = typing.get_type_hints(cls)
    table, values = dict(table), dict(fixed)
    for f in fields(cls):
        if f.name in fixed:
            continue
        if f.name not in table:
            if f.default is MISSING and f.default_factory is MISSING:
                raise error(f"{where}: missing key '{f.name}'")
            continue
        value = check_value(table.pop(f.name), hints[f.name], f"{where}.{f.name}", error)
        floor, ceiling = f.metadata.get("least"), f.metadata.get("most")
        if value is not None and floor is not None and value < floor:
            why = f.metadata["least_why"]
            raise error(f"{where}.{f.name} = {value!r}: must be {floor} or more" + (f" ({why})" if why else ""))
        if value is not None and ceiling is not None and value > ceiling:
            why = f.metadata["most_why"]
            raise error(f"{where}.{f.name} = {value!r}: must be {ceiling} or less" + (f" ({why})" if why else ""))
        if value is not None and f.metadata.get("positive") and value <= 0:
            raise error(f"{where}.{f.name} = {value!r}: must be more than 0")
        values[f.name] = value
    if table:
        raise error(f"{where}: unknown key(s) {', '.join(sorted(table))}; known: "
                    f"{', '.join(f.name for f in fields(cls) if f.name not in fixed)}")
    return cls(**values)
