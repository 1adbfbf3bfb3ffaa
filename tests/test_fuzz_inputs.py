"""Hostile input never hangs, eats memory or prints a traceback: a few hundred fuzzed cases
over every input surface (see fuzz_inputs), plus the inputs that once broke the contract,
each under a time limit and a 1 GiB memory limit. benchmarks/fuzz_inputs.py runs the same
fuzzing at scale."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_inputs import ALIAS_BOMB, Case, cases, problems, run_alone, run_cases

BATCH = 25  # cases per driver process


@pytest.mark.slow
@settings(max_examples=12, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(st.lists(cases(), min_size=BATCH, max_size=BATCH))
def test_fuzzed_inputs_keep_the_error_contract(batch):
    outcomes = run_cases(batch)
    broken = [f"{case.describe()[:300]}: {'; '.join(found)}"
              for case, outcome in zip(batch, outcomes, strict=True) if (found := problems(case, outcome))]
    assert not broken, "\n".join(broken)


def _grid(text: str) -> dict[str, bytes]:
    return {"s.txt": text.encode()}


# the inputs of issue 13, each with a fragment of the one error line it must give
KNOWN = [
    (Case(("validate", "s.csv"), {"s.csv": b"2147483648F0\n"}), "stage 2147483648 is over the limit"),
    (Case(("validate", "s.txt"), _grid("d0: 99999999999999999999F0\n")), "is over the limit of 8,192 stages"),
    (Case(("validate", "s.txt"), _grid("# stages: 99999999999\nd0: 0F0 0B0\n")), "header stages=99999999999: over the limit"),
    (Case(("validate", "s.txt"), _grid("d0: 0F0 0B0 0F99999999 0B99999999\n")), "microbatch 99999999 is over the limit"),
    (Case(("validate", "s.txt"), _grid("d0: 0F0 0B0 0F999999 0B999999\n")), "microbatch 999999 is over the limit"),
    (Case(("validate", "s.json"), {"s.json": b'{"format": "pipesched-schedule", "name": "x", "placement": [[0]], '
                                              b'"microbatches": 99999999999, "devices": [["0F0", "0B0"]]}'}),
     "field microbatches=99999999999: over the limit"),
    (Case(("validate", "s.json"), {"s.json": b"[" * 100_000 + b"]" * 100_000}), "nested deeper than 32 levels"),
    (Case(("costs", "--model", "m.yaml", "--device", "cpu"), {"m.yaml": ALIAS_BOMB.encode()}),
     "values once its anchors and aliases are expanded"),
    (Case(("costs", "--model", "config.json", "--device", "cpu"),
          {"config.json": b'{"num_hidden_layers": 2, "hidden_size": ' + b"9" * 320 + b', "num_attention_heads": 2, '
                          b'"intermediate_size": 8, "vocab_size": 8}'}), "numbers have at most 40"),
    (Case(("costs", "--model", "config.json", "--device", "cpu"),
          {"config.json": b'{"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, '
                          b'"intermediate_size": 8, "vocab_size": 8, "head_dim": Infinity}'}), "Infinity is not a number"),
    (Case(("costs", "--model", "m.yaml", "--device", "cpu"),
          {"m.yaml": b"num_layers: 1000000\nhidden_size: 8\nnum_heads: 2\nffn_hidden_size: 8\nvocab_size: 8\n"}),
     "num_layers=1000000: over the limit of 4,096"),
    (Case(("costs", "--model", "m.yaml", "--device", "cpu"),
          {"m.yaml": b"num_layers: 2\nhidden_size: 8\nnum_heads: 2\nffn_hidden_size: 8\nvocab_size: 8\nhead_dim: abc\n"}),
     "head_dim=abc: must be a whole number"),
    (Case(("costs", "--model", "m.yaml", "--device", "cpu"),
          {"m.yaml": b"num_layers: 2\nhidden_size: 8\nnum_heads: 2\nffn_hidden_size: 8\nvocab_size: 8\n"
                     b"position_embeddings: null\n"}), "position_embeddings=None"),
    (Case(("costs", "--model", "m.yaml", "--device", "cpu"),
          {"m.yaml": b"num_layers: 2\nhidden_size: 8\nnum_heads: 2\nffn_hidden_size: 8\nvocab_size: 8\ngated_mlp: [1]\n"}),
     "gated_mlp=[1]: must be true or false"),
    (Case(("costs", "--model", "m.yaml", "--device", "cpu"),
          {"m.yaml": b"name: [1, 2]\nnum_layers: 2\nhidden_size: 8\nnum_heads: 2\nffn_hidden_size: 8\nvocab_size: 8\n"}),
     "model.name=[1, 2]: must be a non-empty text name"),
    (Case(("partition", "--model", "tiny", "--cluster", "c.yaml", "-p", "2"),
          {"c.yaml": b"nodes:\n- count: 100000000\n  devices_per_node: 8\n  device: h100-sxm\n"
                     b"intra_node: {bandwidth: 1}\ninter_node: {bandwidth: 1}\n"}), "over the limit of 65,536 devices"),
    (Case(("partition", "--model", "tiny", "--cluster", "c.yaml", "-p", "2"),
          {"c.yaml": b"nodes:\n- devices_per_node: 100000000000000000000\n  device: h100-sxm\n"
                     b"intra_node: {bandwidth: 1}\ninter_node: {bandwidth: 1}\n"}), "over the limit of 65,536 devices"),
    (Case(("partition", "--model", "tiny", "--device", "cpu", "-p", "99999999999999999999")), "p=99999999999999999999: over the limit"),
    (Case(("show", "interleaved-1f1b", "-p", "65536", "-m", "2")), "p=65536: over the limit of 1,024"),
    (Case(("simulate", "1f1b", "-p", "100000", "-m", "4", "--stage-costs", "c.csv"),
          {"c.csv": b"stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1,1\n"}),
     "p=100000: over the limit"),
    (Case(("simulate", "1f1b", "-p", "2", "-m", "2", "-b", "0", "--stage-costs", "c.csv"),
          {"c.csv": b"stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1,1\n"}),
     "micro_batch_size=0: must be at least 1"),
    (Case(("validate", "s.txt", "--activation-limit", "-1"), _grid("d0: 0F0 0B0\n")), "activation-limit=-1: must be at least 1"),
    (Case(("costs", "--model", "tiny", "--device", "cpu", "-s", "1000000000")), "seq_len=1000000000: over the limit"),
    (Case(("validate", "s.txt"), _grid("d0: 0F0 " + "9" * 5000 + "F0\n")), "... (5,002 characters)"),
    (Case(("validate", "s.csv"), {"s.csv": b"0F0," + b"x" * 900_000 + b"\n"}), "field larger than field limit"),
    (Case(("simulate", "1f1b", "-p", "2", "-m", "2", "--stage-costs", "c.csv"),
          {"c.csv": b"stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1," + b"7" * 90_000
                    + b"\n"}), "a number of 90,000 characters"),
]


@pytest.mark.slow
def test_the_inputs_that_once_broke_the_contract_give_one_short_line():
    outcomes = run_cases([case for case, _ in KNOWN])
    for (case, fragment), outcome in zip(KNOWN, outcomes, strict=True):
        assert problems(case, outcome) == [], case.describe()[:200]
        assert outcome["code"] == 2 and fragment in outcome["err"], (case.describe()[:200], outcome["err"])
        assert len(outcome["err"]) < 600, outcome["err"]


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 6, 7, 10, 15, 19])
def test_each_alone_in_its_own_limited_process(index):
    case, fragment = KNOWN[index]
    outcome = run_alone(case)
    assert problems(case, outcome) == [] and fragment in outcome["err"], outcome
