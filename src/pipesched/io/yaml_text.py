"""YAML input files (clusters, model shapes) with one-line errors."""

from __future__ import annotations

import yaml

from pipesched.errors import PipeschedError


def load_yaml(text: str, *, field: str, source: str) -> object:
    """Parse YAML ``text``; a syntax error becomes ``field=source: not valid YAML at line N``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PipeschedError(f"{field}={source}: not valid YAML{where}; fix the file") from None
