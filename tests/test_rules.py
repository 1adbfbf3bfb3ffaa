"""The rules table drives everything that knows op kinds: dependencies, validation, memory,
the compiled graph and the communication pass. A toy kind added to the table shows it."""

from __future__ import annotations

import pytest

from pipesched.costs import StageCosts
from pipesched.generators import FAMILIES, generate
from pipesched.ops import OVERLAP_F_B, B, F, I, O, Op, R, W
from pipesched.rules import ACTIVATION, AT_START, GRADIENT, RULES, KindRule, MemoryEffect, Need
from pipesched.schedule import Placement, Schedule
from pipesched.simulate import Network, compile_graph, run, simulate
from pipesched.slots import inflight_per_device, slot_table
from pipesched.validation import LOCAL_ORDER, MISSING, validate

X = "X"  # a toy kind: a second forward pass over a stage's output, streamed to the next stage
TOY = KindRule(X, "toy second forward", needs=(Need(0, (F,)), Need(-1, (X,), ACTIVATION)), cost="forward",
               memory=MemoryEffect(whole=+0.5, at=AT_START))
TOY_RULES = RULES.with_kind(TOY, complete=(frozenset({F, X, B}), frozenset({F, X, I, W})))


def toy_schedule(device_ops: list[str]) -> Schedule:
    rows = tuple(tuple(Op(int(t[0]), t[1] if t[1] == X else Op.parse(t).kind, int(t[2:])) for t in line.split())
                 for line in device_ops)
    return Schedule("toy", Placement.one_per_device(2), 2, rows, rules=TOY_RULES)


TOY_TABLE = ["0F0 0X0 0F1 0X1 0B0 0B1", "1F0 1X0 1B0 1F1 1X1 1B1"]


def test_default_table_matches_the_kind_order_and_the_documented_dependencies():
    # the one kind index: the table's order, fused kinds last
    assert [RULES.index(kind) for kind in (F, I, W, B, O, R, OVERLAP_F_B)] == list(range(7))
    schedule = generate("zb-h1", 3, 2)
    assert schedule.predecessors(Op.parse("1F0")) == (Op.parse("0F0"),)
    assert schedule.predecessors(Op.parse("1I0")) == (Op.parse("1F0"), Op.parse("2I0"))
    assert schedule.predecessors(Op.parse("2I0")) == (Op.parse("2F0"),)
    assert schedule.predecessors(Op.parse("1W0")) == (Op.parse("1I0"),)
    assert generate("1f1b", 3, 2).predecessors(Op.parse("0B1")) == (Op.parse("0F1"), Op.parse("1B1"))
    assert RULES.sends(F) == ((1, ACTIVATION),) and RULES.sends(B) == RULES.sends(I) == ((-1, GRADIENT),)
    assert RULES.sends(W) == ()
    # in flight: F takes one stage-microbatch, the op that ends the backward gives it back
    assert [RULES.units_delta(k) for k in (F, I, W, B)] == [1, 0, -1, -1]
    assert RULES.describe_complete() == "one F and either one B or one I and one W"


def test_memory_effects_sum_to_zero_over_each_complete_set():
    for kinds in RULES.complete:
        for input_frees in (0.0, 0.3, 1.0):
            assert sum(RULES[k].memory.bytes(7.0, input_frees, 5.0) for k in kinds) == pytest.approx(0.0)


def test_a_toy_kind_is_validated_by_its_rules():
    assert validate(toy_schedule(TOY_TABLE)) == []
    missing = validate(toy_schedule(["0F0 0X0 0F1 0X1 0B0 0B1", "1F0 1X0 1B0 1F1 1B1"]))
    assert [(v.kind, v.ops) for v in missing] == [(MISSING, (Op(1, X, 1),))]
    early = validate(toy_schedule(["0F0 0X0 0F1 0X1 0B0 0B1", "1X0 1F0 1B0 1F1 1X1 1B1"]))
    assert [v.kind for v in early] == [LOCAL_ORDER]
    assert Op(1, X, 0) in early[0].ops and Op(1, F, 0) in early[0].ops


def test_a_toy_kind_runs_in_the_compiled_engine_with_its_messages_and_memory():
    schedule = toy_schedule(TOY_TABLE)
    # F = X = 1 slot, B = 2, worked by hand:
    #   d0: 0F0 [0,1] 0X0 [1,2] 0F1 [2,3] 0X1 [3,4]            0B0 [5,7]      0B1 [9,11]
    #   d1:       1F0 [1,2] 1X0 [2,3] 1B0 [3,5] 1F1 [5,6] 1X1 [6,7] 1B1 [7,9]
    assert slot_table(schedule).makespan == 11.0
    costs = StageCosts.uniform(2, activation_bytes=4.0, output_bytes=1.0)
    graph = compile_graph(schedule, costs, Network.uniform(2, latency=0.5, bandwidth=float("inf")))
    # F -> F and X -> X go down, B -> B comes back up: two microbatches each
    assert graph.num_transfers == 6
    timeline = run(graph)
    assert timeline.makespan > 11.0
    # each X keeps half a stage-microbatch's activations (never freed here): device 0 holds
    # F0 + X0 + F1 + X1 = 3 x 4 bytes at its peak and 2 x 0.5 x 4 at the end
    memory = timeline.memory
    assert memory.peak[0] == pytest.approx(12.0)
    assert memory.values[0][-1] == pytest.approx(4.0)
    # the in-flight count (slot units) follows the same rule
    assert inflight_per_device(schedule) == [3, 2]  # device 1: F0 X0 (1.5) B0 (0.5) F1 X1 (2)


def test_every_family_is_complete_under_the_default_rules():
    for name in FAMILIES:
        schedule = generate(name, 4, 8)
        present = {(op.stage, op.microbatch): set() for _, op in schedule.ops()}
        for _, op in schedule.ops():
            present[(op.stage, op.microbatch)].add(op.kind)
        assert all(frozenset(kinds) in RULES.complete for kinds in present.values()), name
        assert simulate(schedule, StageCosts.uniform(schedule.num_stages),
                        Network.uniform(4, latency=0.0, bandwidth=float("inf"))).makespan > 0
