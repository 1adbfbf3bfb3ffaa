"""Terminal views: the Unicode timeline and the metric tables."""

from __future__ import annotations

import doctest

import pytest
from rich.console import Console

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.render import gantt, html, style, summary, terminal, trace, waits
from pipesched.render.terminal import comparison_table, metrics_table, timeline_view
from pipesched.slot_table import slot_table
from render_timelines import GIB, simulated, split_backward, with_transfers


def plain(renderable, width: int) -> list[str]:
    console = Console(width=width, color_system=None, highlight=False)
    with console.capture() as out:
        console.print(renderable)
    return out.get().splitlines()


@pytest.mark.parametrize("module", [terminal, style, summary, waits, html, gantt, trace])
def test_docstring_examples(module) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0


@pytest.mark.parametrize("width", [40, 80, 157])
def test_rows_fit_the_width_and_show_every_device(width: int) -> None:
    timeline = slot_table(generate("1f1b", 4, 8))
    lines = plain(timeline_view(timeline, width=width), width)
    rows = [line for line in lines if line.startswith("d")]
    assert [row.split()[0] for row in rows] == ["d0", "d1", "d2", "d3"]
    assert all(len(line) <= width for line in lines)
    # the legend names the kinds present and nothing else
    assert "forward" in lines[-1] and "backward (full)" in lines[-1] and "input" not in lines[-1]


def test_wide_view_labels_every_op_and_measures_idle() -> None:
    timeline = slot_table(generate("1f1b", 4, 8))
    lines = plain(timeline_view(timeline, width=160), 160)
    row0 = next(line for line in lines if line.startswith("d0"))
    # 33 slots over ~150 columns: every op is wide enough for its label
    for microbatch in range(8):
        assert f"F{microbatch}" in row0 and f"B{microbatch}" in row0
    # 1F1B p=4 m=8: each device idles (p-1)(F+B) = 9 of 33 slots
    assert row0.rstrip().endswith("27.3%")
    assert "iteration 33 slots" in lines[0] and "bubble 27.3%" in lines[0]


def test_narrow_view_falls_back_to_kind_letters() -> None:
    timeline = slot_table(generate("1f1b", 8, 32))
    lines = plain(timeline_view(timeline, width=40), 40)
    row = next(line for line in lines if line.startswith("d7"))
    assert set(row[3:-7]) <= {"F", "B", "·", " "} and "F" in row and "B" in row


def test_simulated_view_shows_seconds_and_memory() -> None:
    timeline = simulated(split_backward(generate("1f1b", 4, 8)), capacity=3 * GIB)
    lines = plain(timeline_view(timeline, width=120), 120)
    assert "ms" in lines[0] and "peak memory 4.00 GiB" in lines[0] and "OUT OF MEMORY" in lines[0]
    assert " ms" in lines[-2]  # the time axis
    assert "backward (input)" in lines[-1] and "backward (weight)" in lines[-1]


def test_width_too_small_is_a_user_error() -> None:
    with pytest.raises(PipeschedError, match=r"^width=10: "):
        timeline_view(slot_table(generate("1f1b", 2, 2)), width=10)


def test_metrics_table_has_a_row_per_timeline() -> None:
    timelines = [slot_table(generate("gpipe", 4, 8)), with_transfers(generate("1f1b", 4, 8), capacity=16 * GIB)]
    text = "\n".join(plain(metrics_table(timelines, title="metrics"), 160))
    assert "gpipe" in text and "1f1b" in text
    assert "33 slots" in text and "27.3%" in text
    assert "18.00 GiB OOM" in text


def test_comparison_table_takes_any_columns() -> None:
    rows = [{"schedule": "1f1b", "level": "formula", "bubble": 0.2727},
            {"schedule": "gpipe", "level": "table", "peak": None, "bubble": 0.3}]
    text = "\n".join(plain(comparison_table(rows), 120))
    for expected in ("schedule", "level", "bubble", "peak", "0.2727", "formula", "-"):
        assert expected in text


def test_comparison_columns_are_not_markup() -> None:
    text = "\n".join(plain(comparison_table([{"[bold]x[/]": 1, "[/]": "y"}]), 80))
    assert "[bold]x[/]" in text and "[/]" in text
