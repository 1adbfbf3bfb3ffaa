"""YAML input files (clusters, model shapes, measured layers) with one-line errors.

A YAML file is read in two passes. The first walks the parser's events without building
anything and refuses a file nested deeper than MAX_NESTING, or holding more than
MAX_YAML_NODES values once its anchors and aliases are expanded (a few hundred bytes of
nested aliases can stand for gigabytes), or an alias of an anchor that contains it. The
second builds the values, with numbers of at most MAX_NUMBER_CHARS characters.
"""

from __future__ import annotations

import yaml

from pipesched.errors import PipeschedError, shorten
from pipesched.limits import MAX_NESTING, MAX_NUMBER_CHARS, MAX_YAML_NODES

# libyaml's parser when PyYAML has it (fast, and it never recurses), else PyYAML's own
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _TooLarge(Exception):
    """The first pass found a file that breaks a limit (the message says which)."""


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """The safe loader with numbers of bounded length."""


def _bounded_number(kind: str):
    base = getattr(yaml.SafeLoader, f"construct_yaml_{kind}")

    def construct(loader, node):
        if len(node.value) > MAX_NUMBER_CHARS:
            raise _TooLarge(f"a number of {len(node.value):,} characters ({node.value[:20]}...); "
                            f"numbers have at most {MAX_NUMBER_CHARS}")
        return base(loader, node)

    return construct


_Loader.add_constructor("tag:yaml.org,2002:int", _bounded_number("int"))
_Loader.add_constructor("tag:yaml.org,2002:float", _bounded_number("float"))


def _check_shape(text: str) -> None:
    """The first pass: nesting depth and the number of values once aliases are expanded."""
    expanded = 0  # values so far, each alias counted as the values of its anchor
    open_collections: list[tuple[str | None, int]] = []  # (anchor, values before it began)
    anchors: dict[str, int] = {}  # anchor -> values it stands for (complete anchors only)
    for event in yaml.parse(text, Loader=_BaseLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_collections) >= MAX_NESTING:
                raise _TooLarge(f"nested deeper than {MAX_NESTING} levels; flatten it")
            open_collections.append((event.anchor, expanded))
            expanded += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, before = open_collections.pop()
            if anchor is not None:
                anchors[anchor] = expanded - before
        elif isinstance(event, yaml.ScalarEvent):
            expanded += 1
            if event.anchor is not None:
                anchors[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_collections):
                raise _TooLarge(f"alias *{shorten(event.anchor)} refers to a value that contains it; "
                                "write the value out")
            expanded += anchors.get(event.anchor, 1)  # an unknown anchor: the loader says so
        if expanded > MAX_YAML_NODES:
            raise _TooLarge(f"more than {MAX_YAML_NODES:,} values once its anchors and aliases are expanded; "
                            "give a smaller file or fewer aliases")


def load_yaml(text: str, *, field: str, source: str) -> object:
    """Parse YAML ``text``; any problem becomes one line ``field=source: ...``."""
    try:
        _check_shape(text)
        return yaml.load(text, Loader=_Loader)
    except _TooLarge as exc:
        raise PipeschedError(f"{field}={source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PipeschedError(f"{field}={source}: not valid YAML{where}; fix the file") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # e.g. a date 2024-13-45
        raise PipeschedError(f"{field}={source}: a value YAML cannot read ({shorten(str(exc))}); fix the file") from None
