"""The `pipesched` process as a user runs it: its output and exit status survive the fast
end (``cli.run``), and a serving simulation loads neither the training experiments nor the
pictures' or the search's modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each starts a process

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _pipesched(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "pipesched", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def _loaded(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, env=env, check=True, timeout=120).stdout
    return set(out.split())


def test_the_process_prints_all_of_its_json_and_succeeds():
    proc = _pipesched("serve", "simulate", "--requests", "6", "--json", "--per-request")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["requests"] == 6 and len(result["per_request"]) == 6


def test_the_process_ends_with_the_error_status_and_one_line():
    proc = _pipesched("serve", "simulate", "--requests", "0")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error: requests=0")


def test_the_process_writes_its_files_before_it_ends(tmp_path: Path):
    html = tmp_path / "serve.html"
    proc = _pipesched("serve", "simulate", "--requests", "4", "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    assert html.read_text(encoding="utf-8").rstrip().endswith("</html>")


def test_a_serving_simulation_loads_no_training_experiment_picture_search_or_other_command():
    loaded = _loaded("import pipesched.cli.serve, pipesched.experiments.serving")
    for module in ("pipesched.experiments.evaluation", "pipesched.experiments.point", "pipesched.generators",
                   "pipesched.render.views", "pipesched.render.serving", "pipesched.search.serving",
                   "pipesched.cli.search", "pipesched.runtime", "pipesched.serving.pool_search",
                   "pipesched.serving.pool_result", "pipesched.serving.offload", "pipesched.serving.offload_search",
                   "pipesched.experiments.residency", "pipesched.render.residency"):
        assert module not in loaded, module


def test_the_experiments_package_gives_its_functions_whatever_was_imported_first():
    """The package loads its names lazily: ``evaluate`` and ``grid`` are the functions after
    their modules (``evaluation``, ``grids``) were imported directly."""
    code = ("import pipesched.experiments.evaluation, pipesched.experiments.grids\n"
            "from pipesched.experiments import Point, evaluate, grid, process_map\n"
            "import pipesched.experiments as e\n"
            "print(callable(evaluate) and evaluate.__module__, callable(grid) and grid.__module__, "
            "e.evaluate is evaluate, Point.__name__, process_map.__name__)")
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         timeout=120).stdout.split()
    assert out == ["pipesched.experiments.evaluation", "pipesched.experiments.grids", "True", "Point", "process_map"]
