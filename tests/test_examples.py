"""The examples in examples/ run and print what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
def test_quickstart_runs() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["1f1b", "zb-v"]
    assert all("simulated" in line and "GiB" in line for line in lines)


@pytest.mark.slow
def test_experiments_example_runs() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "experiments.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 9 and all("tokens/s" in line for line in lines[:8])
    # the what-if is slower, never faster
    before, after = (float(x.split()[0]) for x in lines[-1].split(": ")[1].split(" -> "))
    assert after > before


def test_example_cluster_files_load() -> None:
    from pipesched.model import load_cluster

    clusters = list(EXAMPLES.glob("cluster_*.yaml"))
    assert clusters
    for path in clusters:
        assert load_cluster(str(path)).num_devices >= 2


@pytest.mark.slow
def test_training_runs_example_runs() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "training_runs.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.strip().splitlines()}
    assert list(rows) == ["plain", "frozen", "recompute", "offload"]
    seconds = {name: float(line.split()[1]) for name, line in rows.items()}
    assert seconds["frozen"] < seconds["plain"] < seconds["recompute"]
    assert "frozen stages [0]" in rows["frozen"] and "host peak 0.0 GiB" not in rows["offload"]
