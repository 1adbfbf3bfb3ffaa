"""The name of a frozen record in a results store: a digest of its fields as canonical JSON
(``record_key``), in which equal values are equal (a whole float as the int it equals, a
record as its type's name and fields, a set sorted). A training point's key
(``point.point_key``) and a serving point's (``serving.serving_key``) are made of these."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping


def record_key(record: object) -> str:
    """The name of any frozen record (a serving point, ``experiments.serving``) in a results
    store: a digest of its fields as canonical JSON, as ``point_key`` names a Point."""
    return hashlib.sha256(record_json(record).encode()).hexdigest()[:32]  # 128 bits


@functools.lru_cache(maxsize=4096)
def record_json(record: object) -> str:
    """One record's fields as canonical JSON (cached: the points of a grid share records)."""
    return json.dumps(_canonical(record)["fields"], sort_keys=True, separators=(",", ":"))


@functools.cache
def _field_names(record: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(record))


def _canonical(value: object) -> object:
    """``value`` as plain data in which equal values are equal: a whole float as the int it
    equals (1.0 == 1), a record as its type's name and fields (a given table, measured costs,
    a model or cluster given as a record, an offload policy), a set sorted."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, int):
        return value
    if isinstance(value, tuple | list):
        return [_canonical(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _canonical(item) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((_canonical(item) for item in value), key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__,
                "fields": {name: _canonical(getattr(value, name)) for name in _field_names(type(value))}}
    if hasattr(value, "tolist"):  # a numpy array or scalar
        return _canonical(value.tolist())
    raise TypeError(f"a point field of type {type(value).__name__} has no canonical form")
