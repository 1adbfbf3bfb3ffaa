"""Record the zero-bubble reference heuristic's tables for tests/test_zero_bubble_reference.py.

Runs the heuristic of sail-sg/zero-bubble-pipeline-parallelism itself (its
``megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py``: ``Graph.manual_order`` over
the eight policy variants via ``initial_solution``, tables by ``create_scheduled_nodes``) on
the cases below and writes one file per case into tests/reference/zero_bubble/. The reference
is loaded from a checkout given on the command line; its package imports (torch, pulp, the
megatron package) are replaced by the few names the scheduler module uses.

    python tests/reference/make_zero_bubble_reference.py PATH/TO/zero-bubble-pipeline-parallelism [COMMIT]

(COMMIT names the reference's version when PATH is an export rather than a git checkout.)

Memory in the paper's units (M_B = 1): F +1, the reference's B (our I) M_W - 1, W -M_W.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

OUT = Path(__file__).parent / "zero_bubble"
SCHEDULER = "megatron/core/pipeline_parallel/zerobubble/scheduler"

# (name, family, p, m, forward, backward_input, backward_weight, latency, m_w)
CASES = [
    ("uniform_p4_m8_1p", "zb-1p", 4, 8, [1] * 4, [1] * 4, [1] * 4, 0.0, 0.5),
    ("uniform_p4_m8_2p", "zb-2p", 4, 8, [1] * 4, [1] * 4, [1] * 4, 0.0, 0.5),
    ("uniform_p8_m24_1p_full_mw", "zb-1p", 8, 24, [1] * 8, [1] * 8, [1] * 8, 0.0, 1.0),
    ("paper_like_p6_m18_1p", "zb-1p", 6, 18, [1.0] * 6, [1.2] * 6, [0.8] * 6, 0.1, 0.6),
    ("paper_like_p6_m18_2p", "zb-2p", 6, 18, [1.0] * 6, [1.2] * 6, [0.8] * 6, 0.1, 0.6),
    ("uneven_p5_m12_1p", "zb-1p", 5, 12, [1, 2, 1, 1, 3], [2, 2, 1, 3, 1], [1, 0.5, 2, 1, 1], 0.25, 0.5),
    ("uneven_p5_m12_2p", "zb-2p", 5, 12, [1, 2, 1, 1, 3], [2, 2, 1, 3, 1], [1, 0.5, 2, 1, 1], 0.25, 0.5),
    ("slow_links_p4_m16_2p", "zb-2p", 4, 16, [2] * 4, [2] * 4, [1] * 4, 1.5, 0.25),
    ("cheap_w_p8_m32_2p", "zb-2p", 8, 32, [1] * 8, [1.5] * 8, [0.25] * 8, 0.0, 0.75),
    ("heavy_w_p3_m7_1p", "zb-1p", 3, 7, [1, 1, 1], [1, 1, 1], [3, 2, 3], 0.0, 0.5),
]


def load_reference(root: Path) -> types.ModuleType:
    """The reference scheduler module, with stand-ins for the packages it imports."""
    stand_ins = {"torch": {"Tensor": object}, "pulp": {"value": lambda x: x}}
    for name, attributes in stand_ins.items():
        module = types.ModuleType(name)
        for key, value in attributes.items():
            setattr(module, key, value)
        sys.modules[name] = module
    package = SCHEDULER.replace("/", ".")
    parts = package.split(".")
    for depth in range(1, len(parts) + 1):
        module = types.ModuleType(".".join(parts[:depth]))
        module.__path__ = []
        sys.modules.setdefault(".".join(parts[:depth]), module)
    loaded = None
    for stem in ("graph", "zb"):
        spec = importlib.util.spec_from_file_location(f"{package}.{stem}", root / SCHEDULER / f"{stem}.py")
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = loaded
        spec.loader.exec_module(loaded)
    assert loaded is not None
    return loaded


def reference_tables(zb: types.ModuleType, case: tuple) -> list[list[str]]:
    _, family, p, m, forward, backward_input, backward_weight, latency, m_w = case
    limit = p if family == "zb-1p" else 2 * p
    config = zb.GraphConfig(
        cost_f=[float(x) for x in forward], cost_b=[float(x) for x in backward_input],
        cost_w=[float(x) for x in backward_weight], cost_comm=float(latency),
        mem_f=[1.0] * p, mem_b=[m_w - 1.0] * p, mem_w=[-m_w] * p, max_mem=[float(limit)] * p,
        n_stages=p, n_micro=m,
    )
    graph = zb.Graph.build_graph(p, m, config)
    _, _, completion = zb.initial_solution(graph, print_result=False)
    ours = {"F": "F", "B": "I", "W": "W"}
    return [[f"{node.stage}{ours[node.type.value]}{node.microbatch}" for node in stage]
            for stage in zb.create_scheduled_nodes(graph, completion)]


def main(root: Path, commit: str | None) -> None:
    zb = load_reference(root)
    if commit is None:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip() or "unknown"
    OUT.mkdir(exist_ok=True)
    for case in CASES:
        name, family, p, m, forward, backward_input, backward_weight, latency, m_w = case
        lines = [
            f"# the zero-bubble reference heuristic (scheduler/zb.py at {commit}),",
            "# recorded by tests/reference/make_zero_bubble_reference.py",
            f"family: {family}",
            f"p: {p}",
            f"m: {m}",
            "forward: " + " ".join(f"{x:g}" for x in forward),
            "backward_input: " + " ".join(f"{x:g}" for x in backward_input),
            "backward_weight: " + " ".join(f"{x:g}" for x in backward_weight),
            f"latency: {latency:g}",
            f"m_w: {m_w:g}",
        ]
        lines += [f"d{d}: " + " ".join(ops) for d, ops in enumerate(reference_tables(zb, case))]
        (OUT / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
