"""Schedule file formats: round trips, PyTorch's CSV both ways, and malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched import io
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, generate
from pipesched.ops import B, F, I, Op, OpKind, W
from pipesched.schedule import Placement, Schedule


def _same_table(a, b) -> None:
    assert a.device_ops == b.device_ops
    assert a.placement == b.placement
    assert a.num_microbatches == b.num_microbatches
    assert a.route == b.route


@pytest.mark.parametrize("text", ["0F0", "3I1", "3W1", "1B0", "12F130"])
def test_op_text_round_trip(text: str) -> None:
    assert str(Op.parse(text)) == text


@given(st.integers(0, 500), st.sampled_from([F, I, W, B]), st.integers(0, 5000))
def test_op_parse_inverts_str(stage: int, kind: OpKind, mb: int) -> None:
    op = Op(stage, kind, mb)
    assert Op.parse(str(op)) == op


@pytest.mark.parametrize("bad", ["", "F0", "0X1", "0F", "-1F0", "0f0", "0F0x"])
def test_op_parse_rejects(bad: str) -> None:
    with pytest.raises(PipeschedError, match="not an op"):
        Op.parse(bad)


def _all_schedules(p: int = 4, m: int = 8):
    for name, _family in FAMILIES.items():
        try:
            yield generate(name, p, m)
        except PipeschedError:
            continue  # sizes this family forbids are covered by its own tests


@pytest.mark.parametrize("fmt", ["grid", "json"])
def test_every_family_round_trips(fmt: str) -> None:
    count = 0
    for schedule in _all_schedules():
        loaded = io.loads(io.dumps(schedule, fmt), fmt)
        assert loaded == schedule
        assert loaded.name == schedule.name
        count += 1
    assert count >= 2


def test_csv_round_trip_for_single_replica_families() -> None:
    for schedule in _all_schedules():
        if schedule.placement.num_replicas > 1:
            with pytest.raises(PipeschedError, match="replicas"):
                io.dumps(schedule, "csv")
            continue
        _same_table(io.loads(io.dumps(schedule, "csv"), "csv"), schedule)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(st.integers(2, 12), st.integers(1, 40), st.sampled_from(["gpipe", "1f1b"]))
def test_round_trips_property(p: int, m: int, name: str) -> None:
    schedule = generate(name, p, m)
    for fmt in io.FORMATS:
        _same_table(io.loads(io.dumps(schedule, fmt), fmt), schedule)


def test_grid_idle_cells_follow_the_slot_layout() -> None:
    text = io.dumps(generate("1f1b", 2, 2))
    rows = [line for line in text.splitlines() if line.startswith("d")]
    # device 1 starts one step late; device 0 waits for each gradient
    assert rows == ["d0: 0F0 0F1 .   0B0 .   0B1", "d1: .   1F0 1B0 1F1 1B1"]


def test_grid_without_header_infers_placement_and_sizes() -> None:
    schedule = io.loads("0F0 0F1 0B0 0B1\n. 1F0 1B0 1F1 1B1\n")
    assert schedule.placement.replicas == ((0, 1),)
    assert schedule.num_microbatches == 2
    assert schedule.name == "custom"


def test_grid_bad_token_names_line_and_column() -> None:
    with pytest.raises(PipeschedError, match=r"sched\.txt:3:9: bad op token '0Q1'"):
        io.loads("# name: x\nd0: 0F0 0B0\nd1: 1F0 0Q1\n", source="sched.txt")


def test_grid_device_labels_must_count_up() -> None:
    with pytest.raises(PipeschedError, match="d2 out of order"):
        io.loads("d0: 0F0 0B0\nd2: 1F0 1B0\n")


def test_grid_stage_on_two_devices_needs_placement() -> None:
    with pytest.raises(PipeschedError, match="stage 0 appears on devices 0 and 1"):
        io.loads("0F0 0B0\n0F1 0B1\n")


def test_json_errors_name_the_field() -> None:
    with pytest.raises(PipeschedError, match="not valid JSON"):
        io.loads("{", "json")
    with pytest.raises(PipeschedError, match="format"):
        io.loads('{"a": 1}', "json")
    with pytest.raises(PipeschedError, match=r"devices\[0\]\[1\]: bad op token 'zz'"):
        io.loads('{"format": "pipesched-schedule", "name": "x", "placement": [[0]], "microbatches": 1, '
                 '"devices": [["0F0", "zz"]]}', "json")


def test_csv_reads_pytorch_compute_comms_dump() -> None:
    # what _PipelineScheduleRuntime._dump_csv writes by default: comm actions and overlapped pairs
    text = "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,(1F0;1B1)OVERLAP_F_B,1SEND_B0,1B0\n"
    schedule = io.loads(text, "csv")
    assert [str(op) for op in schedule.device_ops[1]] == ["(1F0;1B1)OVERLAP_F_B", "1B0"]
    assert [str(op) for op in schedule.device_ops[0]] == ["0F0", "0B0"]


def test_csv_bad_cell_names_position() -> None:
    with pytest.raises(PipeschedError, match=r"x\.csv:2:2: bad action 'oops'"):
        io.loads("0F0,0B0\n,oops\n", "csv", source="x.csv")


def test_save_and_load_by_extension(tmp_path) -> None:
    schedule = generate("1f1b", 3, 5)
    for suffix in (".txt", ".csv", ".json"):
        path = tmp_path / f"s{suffix}"
        io.save_schedule(schedule, path)
        _same_table(io.load_schedule(path), schedule)


def test_failed_write_leaves_previous_file_intact(tmp_path) -> None:
    path = tmp_path / "s.txt"
    path.write_text("precious\n")
    # two replicas: PyTorch's CSV cannot hold it, so the save fails before writing
    schedule = Schedule("bidir", Placement.bidirectional(2), 2,
                        ((Op(0, F, 0), Op(1, F, 1)), (Op(1, F, 0), Op(0, F, 1))), route=(0, 1))
    with pytest.raises(PipeschedError, match="replicas"):
        io.save_schedule(schedule, tmp_path / "s.csv")
    assert path.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.txt"]


def test_write_atomic_reports_unwritable_places_and_keeps_normal_permissions(tmp_path) -> None:
    import os
    import stat

    from pipesched.io.files import write_atomic

    written = write_atomic(tmp_path / "out.txt", "x")
    assert stat.S_IMODE(os.stat(written).st_mode) & 0o044  # readable by others, like any output
    # /sys refuses new files even for root: one clean error, no temporary left behind
    with pytest.raises(PipeschedError, match=r"output=/sys/pipesched-test\.png: cannot write"):
        write_atomic("/sys/pipesched-test.png", b"1")
    with pytest.raises(PipeschedError, match="does not exist"):
        write_atomic(tmp_path / "no" / "such" / "dir.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
