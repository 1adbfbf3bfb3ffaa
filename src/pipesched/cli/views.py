"""The picture options shared by `show`, `simulate` and `compare`: --png, --svg, --trace,
--html, and the Unicode timeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from pipesched.cli.output import wrote
from pipesched.io.files import check_output_path

if TYPE_CHECKING:  # rich and numpy load with the commands that draw
    from rich.console import Console

    from pipesched.timeline import Timeline

Png = Annotated[str | None, typer.Option("--png", help="write a Gantt chart (PNG) to this file")]
Svg = Annotated[str | None, typer.Option("--svg", help="write a Gantt chart (SVG) to this file")]
Trace = Annotated[str | None, typer.Option("--trace", help="write a Perfetto / Chrome trace (JSON) to this file")]
Html = Annotated[str | None, typer.Option("--html", help="write the interactive HTML report to this file")]
NoTimeline = Annotated[bool, typer.Option("--no-timeline", help="do not print the Unicode timeline")]


@dataclass(frozen=True)
class ViewPaths:
    png: str | None = None
    svg: str | None = None
    trace: str | None = None
    html: str | None = None

    def check(self) -> ViewPaths:
        """Fail on an unwritable path before any work is done."""
        for field in ("png", "svg", "trace", "html"):
            path = getattr(self, field)
            if path is not None:
                check_output_path(path, field)
        return self

    @property
    def any(self) -> bool:
        return any(getattr(self, f) is not None for f in ("png", "svg", "trace", "html"))

    def write(self, timelines: Sequence[Timeline], *, comparison: Sequence[Mapping[str, object]] | None = None,
              title: str = "", distributions: Sequence[Mapping[str, object]] | None = None) -> None:
        if not self.any:
            return
        from pipesched.render.views import write_views

        written = write_views(timelines, png=self.png, svg=self.svg, trace=self.trace, html=self.html,
                              comparison=comparison, title=title, distributions=distributions)
        for path in written:
            wrote(path)


def print_timeline(timeline: Timeline, console: Console) -> None:
    from pipesched.render.terminal import timeline_view

    console.print(timeline_view(timeline, width=max(console.width, 40)))
