"""The docstring examples of the cost model and the partitioner run as tests."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "pipesched.model",
    "pipesched.model.clusters",
    "pipesched.model.devices",
    "pipesched.model.kernels",
    "pipesched.model.loading",
    "pipesched.model.presets",
    "pipesched.model.stages",
    "pipesched.model.transformer",
    "pipesched.model.units",
    "pipesched.partition.balanced",
    "pipesched.partition.core",
    "pipesched.partition.layout",
    "pipesched.partition.memory",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0


def test_modules_with_examples_have_some():
    attempted = sum(doctest.testmod(importlib.import_module(name)).attempted for name in MODULES)
    assert attempted >= 20
