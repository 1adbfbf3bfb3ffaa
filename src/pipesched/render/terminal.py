"""Terminal views: a Unicode timeline scaled to the terminal width, the time-aligned grid
of a slot table, and metric tables.

Each character cell of the timeline covers ``makespan / columns`` of time and shows the op
running at the cell's middle: its kind's colour as background, with the op's label
(``F3``: kind and microbatch; the stage is added on devices with several stages) where the
op is wide enough, else the kind letter. Idle cells are a dim ``·``. A device that offloads
activations gets a second row, ``h<d>``, for its host link (offloads and reloads).

The grid (``grid_view``, what ``show`` prints on a terminal) keeps time instead: every slot
is the same number of columns (the widest op text and a space), so an op's token is as
wide as its duration (a 2-slot B twice a 1-slot F, a fused pair as wide as the pair) and a
column is one moment on every device. A table wider than the terminal is cut into time
bands, each under a slot axis, at slot boundaries; an op across a boundary is drawn in
both bands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipesched.errors import require
from pipesched.render.style import (
    LABEL_ON_KIND,
    chunk_shade,
    device_labels,
    format_memory,
    kind_styles,
    lighten,
    op_label,
    time_scale,
)
from pipesched.render.summary import op_chunks, summarize
from pipesched.timeline import Timeline

IDLE_CELL = "·"
# the grid: what fills an op's token after its text when colour cannot show its extent
GRID_FILL = "─"
# characters around the bar: "d12 " before, " 27.3%" (idle share of the device) after
_IDLE_WIDTH = 7
_MIN_BAR = 10


def timeline_view(timeline: Timeline, *, width: int) -> Group:
    """The timeline as coloured text ``width`` characters wide: a header with the key
    metrics, one row per device, a time axis and a legend.

    >>> from pipesched.generators import generate
    >>> from pipesched.slots import slot_table
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
    names = device_labels(timeline)
    label_width = max(len(name) for name in names) + 1
    columns = max(_MIN_BAR, width - label_width - _IDLE_WIDTH)
    span = timeline.makespan
    cell_rows = _cell_rows(timeline, columns)
    host_rows = _cell_rows(timeline, columns, compute=False)
    chunk, chunks = op_chunks(timeline)
    idle_share = timeline.idle_per_device() / span if span > 0 else np.zeros(timeline.num_devices)

    lines = [Text(f"{summary.name} ({summary.source}): {summary.headline()}", style="bold")]
    for device in range(timeline.num_devices):
        line = Text(names[device].ljust(label_width), style="bold")
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


def grid_view(timeline: Timeline, *, width: int, color: bool = True) -> Group:
    """The time-aligned grid of ``timeline`` (module docstring), no line wider than
    ``width``; ``color`` False draws each op's extent with GRID_FILL instead of its colour.

    >>> from pipesched.generators import generate
    >>> from pipesched.slots import slot_table
    >>> from rich.console import Console
    >>> console = Console(width=40, color_system=None)
    >>> with console.capture() as out:
    ...     console.print(grid_view(slot_table(generate("1f1b", 2, 2)), width=40, color=False))
    >>> print("\\n".join(line.rstrip() for line in out.get().splitlines()))
        0   1   2   3   4   5   6   7   8
    d0  0F0 0F1 ·   ·   0B0──── ·   0B1────
    d1  ·   1F0 1B0──── 1F1 1B1──── ·   ·
     F  forward   B  backward (full)  · idle
    """
    require(width >= 24, "width", width, "the terminal grid needs at least 24 columns")
    label_width = len(f"d{timeline.num_devices - 1}") + 2
    drawn = timeline.drawn()
    texts = [op_label(timeline, row, several_stages=True) if drawn[row] else "" for row in range(len(timeline))]
    fused = timeline.box_kind != timeline.op_kind
    # columns per slot: the widest plain op text and a space (a fused pair spans its slots)
    per_slot = max((len(texts[row]) for row in np.flatnonzero(drawn & ~fused).tolist()), default=1) + 1
    room = width - label_width
    chunk, chunks = op_chunks(timeline)
    rows = [(f"d{d}", timeline.rows_of_device(d)) for d in range(timeline.num_devices)]
    rows += [(f"h{d}", timeline.rows_of_device(d, compute=False)) for d in range(timeline.num_devices)]
    rows = [(name, mine[drawn[mine]]) for name, mine in rows if name[0] == "d" or len(mine)]
    lines: list[Text] = []
    for first, last in _bands(timeline, max(1, room // per_slot)):
        lines.append(_slot_axis(first, last, per_slot, label_width, room))
        for name, mine in rows:
            line = Text()
            line.append(name.ljust(label_width), style="bold" if name[0] == "d" else "dim")
            line.append_text(_grid_band(timeline, _overlapping(timeline, mine, first, last), texts, first, last,
                                        per_slot, chunk, chunks, color=color))
            lines.append(line)
    lines.append(_legend(timeline))
    return Group(*lines)


def _bands(timeline: Timeline, slots: int) -> list[tuple[int, float]]:
    """(first, last) slot of each band of at most ``slots`` slots: each ends at the latest
    slot boundary no op runs across (or after ``slots`` slots when every one is crossed)."""
    span = timeline.makespan
    start = timeline.op_start - timeline.origin
    end = timeline.op_end - timeline.origin
    boundaries = int(np.ceil(span)) + 2
    # crossed[t]: some op runs from before slot boundary t to after it
    change = np.zeros(boundaries + 1, np.int64)
    inside = end > start
    np.add.at(change, np.floor(start[inside]).astype(np.int64) + 1, 1)
    np.add.at(change, np.ceil(end[inside]).astype(np.int64), -1)
    crossed = np.cumsum(change)[:boundaries] > 0
    bands: list[tuple[int, float]] = []
    first = 0
    while True:
        if first + slots >= span:
            bands.append((first, span))
            return bands
        free = [t for t in range(first + slots, first, -1) if not crossed[t]]
        last = free[0] if free else first + slots
        bands.append((first, float(last)))
        first = last


def _overlapping(timeline: Timeline, rows: np.ndarray, first: float, last: float) -> np.ndarray:
    """The rows (one stream's ops in start order, none overlapping) that run between slots
    ``first`` and ``last``: found by bisection, so a long table's bands cost their own ops."""
    start = timeline.op_start[rows] - timeline.origin
    end = timeline.op_end[rows] - timeline.origin
    return rows[np.searchsorted(end, first, side="right"):np.searchsorted(start, last, side="left")]


def _grid_band(timeline: Timeline, rows: np.ndarray, texts: list[str], first: float, last: float, per_slot: int,
               chunk: np.ndarray, chunks: np.ndarray, *, color: bool) -> Text:
    """One device's ops between slots ``first`` and ``last`` (from the origin), ``per_slot``
    columns a slot; idle columns blank but for a ``·`` where an idle slot starts (to the
    band's end)."""
    origin = timeline.origin
    styles = kind_styles(timeline.schedule.rules)
    bar = Text()
    at = 0  # columns written
    for row in rows.tolist():
        # the op's part inside the band, at least one column
        start = max(float(timeline.op_start[row]) - origin, first)
        end = min(float(timeline.op_end[row]) - origin, last)
        begin = max(round((start - first) * per_slot), at)
        stop = max(round((end - first) * per_slot), begin + 1)
        bar.append(_idle(at, begin, per_slot), style="dim")
        kind, shades = int(timeline.box_kind[row]), int(chunks[timeline.op_device[row]])
        fill = lighten(styles.colors[kind], chunk_shade(int(chunk[row]), shades))
        bar.append(_token(texts[row], op_label(timeline, row, several_stages=shades > 1), styles.marks[kind],
                          stop - begin, color=color), style=f"bold {LABEL_ON_KIND} on {fill}" if color else "bold")
        if stop - begin > 1:
            bar.append(" ")
        at = stop
    bar.append(_idle(at, round((last - first) * per_slot), per_slot), style="dim")
    return bar


def _idle(begin: int, stop: int, per_slot: int) -> str:
    """Idle columns ``begin`` to ``stop`` of a band: blank, a ``·`` where a slot starts."""
    return "".join(IDLE_CELL if column % per_slot == 0 else " " for column in range(begin, stop))


def _token(text: str, short: str, mark: str, columns: int, *, color: bool) -> str:
    """An op's token, ``columns`` wide with the space after it: its text (or its short
    label, or its kind mark) then, without colour, GRID_FILL to its end."""
    if columns <= 1:
        return mark
    room = columns - 1
    label = next((t for t in (text, short) if len(t) <= room), mark * room)
    return label + (" " if color else GRID_FILL) * (room - len(label))


def _slot_axis(first: int, last: float, per_slot: int, label_width: int, room: int) -> Text:
    """Slot numbers over a band: every slot, or every 2, 5, 10, ... when numbers would
    touch; none past ``room`` columns."""
    digits = len(f"{last:g}") + 1
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9) if s * per_slot >= digits)
    axis = [" "] * room
    for tick in range(-(-first // step) * step, int(last) + 1, step):
        position, number = (tick - first) * per_slot, f"{tick:g}"
        if position + len(number) <= room:
            axis[position : position + len(number)] = number
    return Text(" " * label_width + "".join(axis).rstrip(), style="dim")


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
    styles = kind_styles(timeline.schedule.rules)
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
            text = label.center(run) if len(label) <= run else styles.marks[kind] * run
            fill = lighten(styles.colors[kind], chunk_shade(int(chunk[row]), chunks))
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
    """Each op kind present in each of its chunk shades present (darkest: a device's lowest
    stage), then idle."""
    legend = Text()
    styles = kind_styles(timeline.schedule.rules)
    chunk, chunks = op_chunks(timeline)
    shades = {(int(k), int(c), int(n)) for k, c, n in
              np.unique(np.stack([timeline.box_kind, chunk, chunks[timeline.op_device]], 1), axis=0).tolist()}
    for kind in sorted({k for k, _, _ in shades}):
        for _, c, n in sorted(shade for shade in shades if shade[0] == kind):
            legend.append(f" {styles.marks[kind]} ", style=f"bold {LABEL_ON_KIND} on "
                                                           f"{lighten(styles.colors[kind], chunk_shade(c, n))}")
        legend.append(f" {styles.names[kind]}  ")
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
