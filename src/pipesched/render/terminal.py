"""Terminal views: a Unicode timeline scaled to the terminal width, and metric tables.

Each character cell of the timeline covers ``makespan / columns`` of time and shows the op
running at the cell's middle: its kind's colour as background, with the op's label
(``F3``: kind and microbatch; the stage is added on devices with several stages) where the
op is wide enough, else the kind letter. Idle cells are a dim ``·``. A device that offloads
activations gets a second row, ``h<d>``, for its host link (offloads and reloads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipesched.errors import require
from pipesched.render.style import (
    KIND_COLORS,
    KIND_MARKS,
    KIND_NAMES,
    LABEL_ON_KIND,
    chunk_shade,
    format_memory,
    lighten,
    op_label,
    time_scale,
)
from pipesched.render.summary import op_chunks, summarize
from pipesched.timeline import Timeline

IDLE_CELL = "·"
# characters around the bar: "d12 " before, " 27.3%" (idle share of the device) after
_IDLE_WIDTH = 7
_MIN_BAR = 10


def timeline_view(timeline: Timeline, *, width: int) -> Group:
    """The timeline as coloured text ``width`` characters wide: a header with the key
    metrics, one row per device, a time axis and a legend.

    >>> from pipesched.generators import generate
    >>> from pipesched.slot_table import slot_table
    >>> from rich.console import Console
    >>> console = Console(width=50, color_system=None)
    >>> with console.capture() as out:
    ...     console.print(timeline_view(slot_table(generate("1f1b", 2, 2)), width=50))
    >>> print(out.get().rstrip())
    1f1b (table): iteration 9 slots · bubble 33.3%
    d0  F0   F1 ·········    B0   ····    B1     33.3%
    d1 ····  F0     B0    F1     B1   ·········  33.3%
       0 slots            4.5           9 slots   idle
     F  forward   B  backward (full)  · idle
    """
    require(width >= 24, "width", width, "the terminal timeline needs at least 24 columns")
    summary = summarize(timeline)
    label_width = len(f"d{timeline.num_devices - 1}") + 1
    columns = max(_MIN_BAR, width - label_width - _IDLE_WIDTH)
    span = timeline.makespan
    cell_rows = _cell_rows(timeline, columns)
    host_rows = _cell_rows(timeline, columns, compute=False)
    chunk, chunks = op_chunks(timeline)
    idle_share = timeline.idle_per_device() / span if span > 0 else np.zeros(timeline.num_devices)

    lines = [Text(f"{summary.name} ({summary.source}): {summary.headline()}", style="bold")]
    for device in range(timeline.num_devices):
        line = Text(f"d{device}".ljust(label_width), style="bold")
        line.append_text(_device_bar(timeline, cell_rows[device], chunk, int(chunks[device])))
        line.append(f"{idle_share[device]:>{_IDLE_WIDTH}.1%}", style="dim")
        lines.append(line)
        if (host_rows[device] >= 0).any():
            host = Text(f"h{device}".ljust(label_width), style="dim")
            host.append_text(_device_bar(timeline, host_rows[device], chunk, int(chunks[device])))
            lines.append(host)
    lines.append(_axis(timeline, label_width, columns))
    lines.append(_legend(timeline))
    return Group(*lines)


def _cell_rows(timeline: Timeline, columns: int, *, compute: bool = True) -> list[np.ndarray]:
    """For each device, the op row running at the middle of each cell (-1 when idle), on
    its compute stream (or its host link)."""
    span = timeline.makespan
    middles = timeline.origin + (np.arange(columns) + 0.5) * (span / columns)
    out = []
    for device in range(timeline.num_devices):
        rows = timeline.rows_of_device(device, compute=compute)
        starts, ends = timeline.op_start[rows], timeline.op_end[rows]
        where = np.searchsorted(starts, middles, side="right") - 1
        inside = (where >= 0) & (ends[np.clip(where, 0, None)] > middles) if len(rows) else np.zeros(columns, bool)
        cells = np.full(columns, -1, np.int64)
        cells[inside] = rows[where[inside]]
        out.append(cells)
    return out


def _device_bar(timeline: Timeline, cells: np.ndarray, chunk: np.ndarray, chunks: int) -> Text:
    """One device's row: runs of cells of the same op share one centred label."""
    bar = Text()
    column = 0
    while column < len(cells):
        row = int(cells[column])
        run = 1
        while column + run < len(cells) and cells[column + run] == row:
            run += 1
        if row < 0:
            bar.append(IDLE_CELL * run, style="dim")
        else:
            kind = int(timeline.box_kind[row])
            label = op_label(timeline, row, several_stages=chunks > 1)
            text = label.center(run) if len(label) <= run else KIND_MARKS[kind] * run
            fill = lighten(KIND_COLORS[kind], chunk_shade(int(chunk[row]), chunks))
            bar.append(text, style=f"bold {LABEL_ON_KIND} on {fill}")
        column += run
    return bar


def _axis(timeline: Timeline, label_width: int, columns: int) -> Text:
    """Ticks at 0, half and the full iteration time, in the timeline's display unit."""
    span = timeline.makespan
    scale = time_scale(timeline.unit, span)
    left = f"0 {scale.unit}"
    middle = f"{span * scale.factor / 2:.4g}"
    right = f"{span * scale.factor:.4g} {scale.unit}"
    axis = [" "] * columns
    for position, tick in ((0, left), (columns // 2 - len(middle) // 2, middle), (columns - len(right), right)):
        for offset, char in enumerate(tick):
            if 0 <= position + offset < columns:
                axis[position + offset] = char
    return Text(" " * label_width + "".join(axis) + "idle".rjust(_IDLE_WIDTH), style="dim")


def _legend(timeline: Timeline) -> Text:
    legend = Text()
    present = sorted({int(k) for k in np.unique(timeline.box_kind)})
    for kind in present:
        legend.append(f" {KIND_MARKS[kind]} ", style=f"bold {LABEL_ON_KIND} on {KIND_COLORS[kind]}")
        legend.append(f" {KIND_NAMES[kind]}  ")
    legend.append(f"{IDLE_CELL} idle", style="dim")
    return legend


def metrics_table(timelines: Sequence[Timeline], *, title: str = "") -> Table:
    """One row of key metrics per timeline (the ``simulate`` and ``compare`` summary)."""
    table = Table(title=title or None)
    for column, justify in (("schedule", "left"), ("level", "left"), ("devices", "right"),
                            ("microbatches", "right"), ("iteration time", "right"),
                            ("bubble", "right"), ("bubble / work", "right"), ("peak memory", "right")):
        table.add_column(column, justify=justify)
    for timeline in timelines:
        summary = summarize(timeline)
        scale = time_scale(summary.unit, summary.iteration_time)
        memory = "-"
        if summary.peak_memory is not None and summary.memory_unit is not None:
            memory = format_memory(summary.peak_memory, summary.memory_unit)
            if summary.out_of_memory:
                memory = f"[bold red]{memory} OOM[/]"
        table.add_row(
            Text(summary.name), summary.source, str(summary.devices), f"{summary.microbatches:g}",
            scale.format(summary.iteration_time), f"{summary.bubble_ratio:.1%}",
            f"{summary.bubble_over_work:.1%}", memory,
        )
    return table


def comparison_table(rows: Sequence[Mapping[str, object]], *, title: str = "") -> Table:
    """Any list of flat rows (column -> value) as a table; columns in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    table = Table(title=title or None)
    for column in columns:
        numeric = all(isinstance(row.get(column), int | float) for row in rows if column in row)
        # Text, not a markup string: column names may come from input files
        table.add_column(Text(column), justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(Text(format_cell(row.get(column))) for column in columns))
    return table


def format_cell(value: object) -> str:
    """A table cell: floats to 4 significant digits, missing values as ``-``.

    >>> format_cell(0.123456), format_cell(None), format_cell("1f1b")
    ('0.1235', '-', '1f1b')
    """
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
