"""Terminal views: the Unicode timeline and the metric tables."""

from __future__ import annotations

import doctest
import re

import pytest
from rich.console import Console
from rich.style import Style

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.render import gantt, html, style, summary, terminal, trace, waits
from pipesched.render.terminal import comparison_table, metrics_table, timeline_view
from pipesched.slots import slot_table
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


def grid_tokens(lines: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Each op token of a plain grid (text, then GRID_FILL to its extent, then a space):
    its text -> [(column from the row's start, columns with the space after it)]."""
    found: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        if not re.match(r"d\d+ ", line):
            continue
        body = line[line.index(" "):].lstrip(" ")
        offset = len(line) - len(body)
        for match in re.finditer(r"([^\s·─]+)─*", body):
            found.setdefault(match.group(1), []).append((offset + match.start(), len(match.group(0)) + 1))
    return found


def test_grid_columns_follow_time() -> None:
    from pipesched.costs import StageCosts

    # 1 + 2 slots for F and B, 3 for a fused pair (F + B), W and I 1 each
    timeline = slot_table(generate("dualpipev", 4, 8), StageCosts.slots())
    lines = plain(terminal.grid_view(timeline, width=400, color=False), 400)
    tokens = grid_tokens(lines)
    slot = tokens["0F0"][0][1]  # a 1-slot forward's columns: one slot
    first = tokens["0F0"][0][0]  # where time 0 is
    drawn = timeline.drawn()
    checked = 0
    for row in range(len(timeline)):
        if not drawn[row]:
            continue
        text = "&".join(str(op) for op in timeline.entry(row).atoms)
        ((column, columns),) = tokens[text]
        start, end = timeline.op_start[row] - timeline.origin, timeline.op_end[row] - timeline.origin
        assert column == first + start * slot and columns == (end - start) * slot, text
        checked += 1
    assert checked == int(drawn.sum()) and any("&" in text for text in tokens)
    # equal durations, equal widths: every F, I, W one slot, every B two, every fused pair three
    widths = {text[1] if "&" not in text else "&": {w for _, w in places} for text, places in tokens.items()}
    assert widths == {"F": {slot}, "I": {slot}, "W": {slot}, "B": {2 * slot}, "&": {3 * slot}}


@pytest.mark.parametrize("width", [24, 40, 80, 133])
def test_grid_wraps_in_time_bands_within_the_width(width: int) -> None:
    timeline = slot_table(generate("dualpipev", 4, 8))
    lines = plain(terminal.grid_view(timeline, width=width, color=False), width)
    assert all(len(line) <= width for line in lines)
    # 54 slots of 4 columns: bands of at most (width - 4) // 4 slots
    assert sum(1 for line in lines if line.startswith("d0 ")) >= 54 // ((width - 4) // 4)
    # every device row of every band covers its band's slots, no more
    rows = [line for line in lines if line.startswith("d")]
    axes = [line for line in lines if line.lstrip()[:1].isdigit()]
    assert len(rows) == 4 * len(axes)
    if width >= 80:
        # wide enough for bands to end at slot boundaries no op runs across: every op once, whole
        tokens = grid_tokens(lines)
        expected = ["&".join(str(op) for op in timeline.entry(row).atoms) for row in
                    range(len(timeline)) if timeline.drawn()[row]]
        assert sorted(tokens) == sorted(expected) and all(len(places) == 1 for places in tokens.values())


def test_grid_colours_ops_by_kind() -> None:
    timeline = slot_table(generate("zb-h1", 2, 2))
    # rich caches combined styles with the codes of the first console that drew them (an
    # in-process `show` on a 16-colour terminal, earlier in the suite): start afresh
    Style.parse.cache_clear()
    Style._add.cache_clear()
    console = Console(width=80, color_system="truecolor", highlight=False)
    with console.capture() as out:
        console.print(terminal.grid_view(timeline, width=80))
    text = out.get()
    for kind in (0, 1, 2):  # F, I, W
        red, green, blue = (int(style.KIND_COLORS[kind][i:i + 2], 16) for i in (1, 3, 5))
        assert f"48;2;{red};{green};{blue}m" in text
    assert terminal.GRID_FILL not in text
