"""Serving workloads: the trace CSV, synthetic arrivals and lengths, common random numbers."""

from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pipesched.errors import PipeschedError
from pipesched.serving import trace as trace_module
from pipesched.serving.trace import (
    FixedLengths,
    LognormalLengths,
    ResampledLengths,
    Trace,
    TraceSpec,
    UniformLengths,
    ZipfLengths,
    at_unit_rate,
    check_context,
    example_trace_path,
    mean_rate,
    parse_arrival,
    parse_lengths,
    parse_trace,
    rate_scaled,
    read_trace,
    synthetic_trace,
    unit_trace,
    write_trace,
)

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _trace() -> Trace:
    return Trace(np.array([0.0, 0.1 + 0.2, 1.5]), np.array([10, 200, 3]), np.array([1, 7, 40]))


def test_write_then_read_gives_the_same_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(_trace(), path)
    back = read_trace(path)
    assert back.arrived_at.tolist() == [0.0, 0.1 + 0.2, 1.5]  # exact, 0.30000000000000004 included
    assert back.prefill_tokens.tolist() == [10, 200, 3]
    assert back.decode_tokens.tolist() == [1, 7, 40]


def test_extra_columns_and_any_column_order_are_read() -> None:
    text = "num_decode_tokens,session,arrived_at,num_prefill_tokens\n5,a,0.5,12\n6.0,b,0.75,13\n\n"
    got = parse_trace(text)
    assert got.arrived_at.tolist() == [0.5, 0.75]
    assert got.prefill_tokens.tolist() == [12, 13]
    assert got.decode_tokens.tolist() == [5, 6]


@pytest.mark.parametrize(("text", "words"), [
    ("", "empty file"),
    (HEADER, "no requests"),
    ("arrived_at,num_prefill_tokens\n0,1\n", "column=num_decode_tokens: missing from the header"),
    (HEADER + "0,10,5\n2,10,5\n1,10,5\n", r"<text>:4: arrived_at=1: before the arrival above it \(2\)"),
    (HEADER + "-1,10,5\n", "<text>:2: arrived_at=-1: arrivals are seconds"),
    (HEADER + "0,10,5\n1,10.5,5\n", "<text>:3: num_prefill_tokens=10.5: token counts are whole numbers"),
    (HEADER + "0,10,0\n", "<text>:2: num_decode_tokens=0: token counts are whole numbers"),
    (HEADER + "0,10,5\n1,ten,5\n", "<text>:3: num_prefill_tokens='ten': not a number"),
    (HEADER + "0,10\n", "<text>:2: num_decode_tokens: missing"),
    (HEADER + '0,"10\n', "not a CSV row"),
])
def test_bad_trace_files_name_the_line_column_and_fix(text: str, words: str) -> None:
    with pytest.raises(PipeschedError, match=words):
        parse_trace(text)


def test_a_trace_over_the_request_limit_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_module, "MAX_REQUESTS", 3)
    with pytest.raises(PipeschedError, match="more than 3 requests"):
        parse_trace(HEADER + "0,1,1\n" * 5)


def test_all_output_tokens_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_module, "MAX_SERVED_TOKENS", 10)
    with pytest.raises(PipeschedError, match="11 output tokens in all"):
        parse_trace(HEADER + "0,1,5\n1,1,6\n")


def test_read_trace_of_a_missing_file_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(PipeschedError, match=r"trace=.*no such file"):
        read_trace(tmp_path / "absent.csv")


@pytest.mark.parametrize("text", ["fixed:7", "uniform:16-64", "lognormal:1024,0.8", "zipf:1.2,500"])
def test_length_specs_round_trip_as_text(text: str) -> None:
    assert str(parse_lengths(text)) == text


@pytest.mark.parametrize(("text", "words"), [
    ("fixed:0", "at least 1"), ("uniform:64-16", "LO <= HI"), ("lognormal:0,1", "must be > 0"),
    ("zipf:1.2", "give fixed:N"), ("normal:5,1", "give fixed:N"), ("fixed", "give fixed:N"),
    ("lognormal:100,99", "over the limit"), ("fixed:1e3", "not a whole number"),
])
def test_bad_length_specs_name_the_option(text: str, words: str) -> None:
    with pytest.raises(PipeschedError, match=f"output_tokens=.*{words}"):
        parse_lengths(text, "output_tokens")


def test_fixed_and_uniform_lengths_stay_in_their_range() -> None:
    rng = np.random.default_rng(1)
    assert FixedLengths(9).draw(rng, 4).tolist() == [9, 9, 9, 9]
    drawn = UniformLengths(3, 6).draw(rng, 4000)
    assert sorted(set(drawn.tolist())) == [3, 4, 5, 6]
    counts = np.bincount(drawn)[3:]
    assert np.all(np.abs(counts / 4000 - 0.25) < 0.03)


def test_lognormal_lengths_have_the_median_and_spread_asked() -> None:
    drawn = LognormalLengths(1000.0, 0.5).draw(np.random.default_rng(2), 40_000)
    assert abs(np.median(drawn) / 1000 - 1) < 0.02
    assert abs(np.std(np.log(drawn)) / 0.5 - 1) < 0.02
    assert LognormalLengths(0.2, 0.1).draw(np.random.default_rng(3), 50).min() == 1  # clipped to one token


def test_zipf_lengths_follow_the_bounded_law() -> None:
    s, top = 1.5, 50
    drawn = ZipfLengths(s, top).draw(np.random.default_rng(4), 100_000)
    harmonic = sum(k ** -s for k in range(1, top + 1))  # P(k) = k^-s / H(s, top)
    for k in (1, 2, 5):
        assert abs(np.mean(drawn == k) - k ** -s / harmonic) < 0.01
    assert drawn.min() >= 1 and drawn.max() <= top


def test_arrivals_have_the_rate_and_variation_asked() -> None:
    rng = np.random.default_rng(5)
    for text, cv in (("poisson", 1.0), ("gamma:2", 2.0), ("gamma:0.5", 0.5)):
        gaps = parse_arrival(text).gaps(rng, 200_000)
        assert abs(gaps.mean() - 1) < 0.02
        assert abs(gaps.std() / gaps.mean() / cv - 1) < 0.05
    assert parse_arrival("gamma:0").gaps(rng, 3).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(PipeschedError, match="arrival=uniform: give poisson or gamma:CV"):
        parse_arrival("uniform")


def test_a_synthetic_trace_arrives_at_its_rate() -> None:
    got = synthetic_trace(TraceSpec(requests=20_000, qps=4.0, prompt="fixed:8", output="fixed:2", seed=6))
    assert got.arrived_at[0] == 0.0
    assert abs(mean_rate(got) / 4.0 - 1) < 0.03
    assert np.all(got.prefill_tokens == 8) and np.all(got.decode_tokens == 2)


def test_common_random_numbers_same_requests_at_every_rate() -> None:
    slow = synthetic_trace(TraceSpec(requests=300, qps=2.0, seed=7))
    fast = synthetic_trace(TraceSpec(requests=300, qps=5.0, seed=7))
    assert np.array_equal(slow.prefill_tokens, fast.prefill_tokens)
    assert np.array_equal(slow.decode_tokens, fast.decode_tokens)
    np.testing.assert_allclose(fast.arrived_at * 5.0, slow.arrived_at * 2.0, rtol=1e-12)
    other = synthetic_trace(TraceSpec(requests=300, qps=2.0, seed=8))
    assert not np.array_equal(slow.prefill_tokens, other.prefill_tokens)


def test_rate_scaling_a_file_trace() -> None:
    unit = at_unit_rate(_trace())  # 3 requests over 1.5 s: 4/3 requests/s
    assert mean_rate(unit) == pytest.approx(1.0)
    assert mean_rate(rate_scaled(unit, 10.0)) == pytest.approx(10.0)
    with pytest.raises(PipeschedError, match="qps=0: must be > 0"):
        rate_scaled(unit, 0)


def test_lengths_resampled_from_a_file_keep_its_pairs(tmp_path: Path) -> None:
    path = tmp_path / "source.csv"
    write_trace(_trace(), path)
    spec = TraceSpec(requests=200, prompt=f"trace:{path}", output=f"trace:{path}", seed=9)
    assert isinstance(spec.prompt, ResampledLengths) and str(spec.prompt) == f"trace:{path}"
    got = unit_trace(spec)
    pairs = set(zip(got.prefill_tokens.tolist(), got.decode_tokens.tolist(), strict=True))
    assert pairs == {(10, 1), (200, 7), (3, 40)}  # every pair is a row of the file, each drawn


def test_max_context_cuts_requests_to_fit() -> None:
    spec = TraceSpec(requests=2000, prompt="lognormal:3000,1", output="lognormal:500,1.5", seed=10, max_context=4096)
    got = unit_trace(spec)
    assert got.total_tokens.max() <= 4096 and got.prefill_tokens.min() >= 1
    check_context(got, 4096)
    uncut = unit_trace(TraceSpec(requests=2000, prompt="lognormal:3000,1", output="lognormal:500,1.5", seed=10))
    kept = uncut.total_tokens <= 4096
    assert np.array_equal(got.prefill_tokens[kept], uncut.prefill_tokens[kept])  # only the long ones change


def test_check_context_names_the_request_and_the_fix() -> None:
    check_context(_trace(), 0)  # no limit known
    check_context(_trace(), 207)
    with pytest.raises(PipeschedError, match=r"num_prefill_tokens=200: request 1 needs 200 prompt"
                                             r" \+ 7 output tokens, over the model's context of 206"):
        check_context(_trace(), 206)


def test_the_shipped_example_is_the_scripts_output(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "make_example_trace.py"
    module_spec = importlib.util.spec_from_file_location("make_example_trace", script)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    module.main([str(tmp_path / "example.csv")])
    shipped = example_trace_path()
    assert shipped.read_text() == (tmp_path / "example.csv").read_text()
    example = read_trace(str(shipped))
    assert len(example) == 500 and example.total_tokens.max() <= 4096
    assert 1.5 < mean_rate(example) < 2.5


def test_the_docstring_examples_run() -> None:
    result = doctest.testmod(trace_module)
    assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize(("fields", "words"), [
    ({"requests": 0}, "requests=0: must be at least 1"),
    ({"qps": 0.0}, "qps=0.0: must be > 0"),
    ({"seed": -1}, "seed=-1: must be at least 0"),
    ({"max_context": 1}, "max_context=1: give at least 2 tokens"),
    ({"arrival": "gamma:-1"}, "arrival=-1.0: must be >= 0"),
    ({"prompt": "fixed:x"}, "prompt_tokens='x': not a whole number"),
])
def test_bad_trace_specs_are_one_error(fields: dict, words: str) -> None:
    with pytest.raises(PipeschedError, match=words):
        TraceSpec(**fields)
