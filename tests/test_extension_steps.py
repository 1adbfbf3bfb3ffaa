"""Extension point (a): an op coordinate beyond (stage, microbatch), the step index.

A toy decode kind registered through the rules API: a request's prefill (F, step 0), then
k decode steps D (steps 1..k), each needing the previous step of the same microbatch on its
stage (its KV cache) and the same step on the previous stage (its hidden state), each
appending one token's KV cache; E at step k ends the request and frees the whole cache,
(1 + k) tokens: a memory effect that grows with the step. Times and peaks by hand.
"""

from __future__ import annotations

import pytest

from pipesched.costs import StageCosts
from pipesched.dependencies import dependencies
from pipesched.errors import PipeschedError
from pipesched.ops import F, Op
from pipesched.rules import ACTIVATION, AT_START, RULES, KindRule, MemoryEffect, Need
from pipesched.schedule import Placement, Schedule
from pipesched.simulate import Network, compile_graph, run
from pipesched.validation import validate

D, E = "D", "E"  # toy kinds: a decode step, the end of a request
DECODE = KindRule(D, "decode step", needs=(Need(-1, (D,), ACTIVATION), Need(0, (D, F), step_offset=-1)),
                  cost="backward_input", memory=MemoryEffect(whole=+1.0, at=AT_START))
END = KindRule(E, "end of request", needs=(Need(0, (D,)),), cost="backward_weight",
               memory=MemoryEffect(whole=-1.0, per_step=-1.0))
TOY = RULES.with_kind(DECODE).with_kind(END, complete=(frozenset({F, D, E}),))
PREFILL_S, DECODE_S, TOKEN_BYTES = 2.0, 1.0, 10.0
STEPS = 2  # decode steps per request


def decode_table(steps: int = STEPS, microbatches: int = 2, stages: int = 2, swap: bool = False) -> Schedule:
    """Each device: both prefills, then every step's decode for both requests, then the ends."""
    rows = []
    for stage in range(stages):
        ops = [Op(stage, F, mb) for mb in range(microbatches)]
        ops += [Op(stage, D, mb, step=t) for t in range(1, steps + 1) for mb in range(microbatches)]
        ops += [Op(stage, E, mb, step=steps) for mb in range(microbatches)]
        if swap:  # step 2 of request 0 before its step 1: the step need cannot be met
            ops[microbatches], ops[2 * microbatches] = ops[2 * microbatches], ops[microbatches]
        rows.append(tuple(ops))
    return Schedule("toy decode", Placement.one_per_device(stages), microbatches, tuple(rows), rules=TOY)


def toy_costs(stages: int = 2) -> StageCosts:
    return StageCosts.uniform(stages, forward=PREFILL_S, backward_input=DECODE_S, backward_weight=0.0,
                              activation_bytes=TOKEN_BYTES)


def test_step_text_form_is_unchanged_at_step_zero():
    assert str(Op(2, F, 0)) == "2F0" and Op.parse("2F0") == Op(2, F, 0)
    assert str(Op(2, F, 0, step=3)) == "2F0.3" and Op.parse("2F0.3") == Op(2, F, 0, step=3)
    assert str(Op(0, D, 1, step=3)) == "0D1.3"


def test_decode_steps_need_the_previous_step_and_the_previous_stage():
    schedule = decode_table()
    deps = dependencies(schedule)
    ops = [op for _, op in schedule.ops()]
    row = {op: k for k, op in enumerate(ops)}
    for op in ops:
        needed = {ops[r] for r in deps.need_row[row[op]] if r >= 0}
        if op.kind == D:
            expected = {Op(op.stage, D if op.step > 1 else F, op.microbatch, step=op.step - 1 if op.step > 1 else 0)}
            if op.stage > 0:
                expected.add(Op(op.stage - 1, D, op.microbatch, step=op.step))
            assert needed == expected, op


def test_decode_times_and_kv_cache_peak_by_hand():
    timeline = run(compile_graph(decode_table(), toy_costs()))
    got = {str(op): (float(s), float(e)) for (_, op), s, e in
           zip(decode_table().ops(), timeline.op_start, timeline.op_end, strict=True)}
    # device 0 runs its queue back to back: F F (2 each), then four decode steps of 1
    expected = {"0F0": (0, 2), "0F1": (2, 4), "0D0.1": (4, 5), "0D1.1": (5, 6), "0D0.2": (6, 7), "0D1.2": (7, 8),
                "0E0.2": (8, 8), "0E1.2": (8, 8),
                # device 1: each op after the same step on stage 0 and its own previous step
                "1F0": (2, 4), "1F1": (4, 6), "1D0.1": (6, 7), "1D1.1": (7, 8), "1D0.2": (8, 9),
                "1D1.2": (9, 10), "1E0.2": (10, 10), "1E1.2": (10, 10)}
    assert got == {k: (float(a), float(b)) for k, (a, b) in expected.items()}
    # each device holds both requests' caches: (1 prompt + 2 decoded tokens) x 2 requests
    assert timeline.memory.peak == ((1 + STEPS) * 2 * TOKEN_BYTES,) * 2
    # the end of a request at step 2 frees its 3 tokens: nothing is left
    assert [float(values[-1]) for values in timeline.memory.values] == [0.0, 0.0]
    assert timeline.op_step is not None and sorted(set(timeline.op_step.tolist())) == [0, 1, 2]


def test_decode_steps_send_their_hidden_state_over_the_link():
    network = Network.uniform(2, latency=0.5, bandwidth=float("inf"))
    timeline = run(compile_graph(decode_table(), toy_costs(), network))
    got = {str(op): (float(s), float(e)) for (_, op), s, e in
           zip(decode_table().ops(), timeline.op_start, timeline.op_end, strict=True)}
    # every op of stage 1 waits 0.5 more for its input from stage 0: 1F0 [2.5,4.5], 1F1 [4.5,6.5],
    # then the decode steps back to back from 6.5 (each input arrived by then): the last ends at 10.5
    assert got["1F0"] == (2.5, 4.5) and got["1D0.1"] == (6.5, 7.5) and got["1D1.2"] == (9.5, 10.5)
    assert len(timeline.transfers) == 2 + 2 * STEPS  # prefill and decode activations of both requests
    assert timeline.makespan == 10.5


def test_the_validator_reads_steps():
    assert validate(decode_table()) == []
    problems = validate(decode_table(swap=True))
    assert problems and "runs 0D0.2 (position 2) before 0D0.1 (position 4)" in problems[0].message


def test_a_step_before_its_previous_step_deadlocks():
    with pytest.raises(PipeschedError, match=r"schedule=toy decode: local-order: device 0 runs 0D0\.2"):
        run(compile_graph(decode_table(swap=True), toy_costs()))


def test_default_rules_read_no_step():
    assert not RULES.stepped and TOY.stepped
