"""The picture options shared by `show`, `simulate` and `compare`: --png, --svg, --perfetto,
--html, and the Unicode timeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from pipesched.cli.options import OptionGroup
from pipesched.cli.output import wrote
from pipesched.errors import PipeschedError
from pipesched.io.files import Output, check_outputs, write_all

if TYPE_CHECKING:  # rich and numpy load with the commands that draw
    from rich.console import Console

    from pipesched.timeline import Timeline

Png = Annotated[str | None, typer.Option("--png", help="write a Gantt chart (PNG) to this file")]
Svg = Annotated[str | None, typer.Option("--svg", help="write a Gantt chart (SVG) to this file")]
Trace = Annotated[str | None, typer.Option("--perfetto", help="write a Perfetto / Chrome trace (JSON) to this file")]
Html = Annotated[str | None, typer.Option("--html", help="write the interactive HTML report to this file")]
ShareAxis = Annotated[bool, typer.Option(
    "--share-axis", help="draw every timeline on one time axis, 0 to the longest (--png, --svg; --html opens with "
                         "its 'one time axis' box ticked); without it each timeline has its own axis")]
NoTimeline = Annotated[bool, typer.Option("--no-timeline", help="do not print the Unicode timeline")]


@dataclass(frozen=True)
class ViewPaths(OptionGroup):
    """The pictures asked for: a path per view (None: not drawn)."""

    png: Png = None
    svg: Svg = None
    trace: Trace = None
    html: Html = None
    share_axis: ShareAxis = False  # every timeline on one time axis (the Gantt chart, the report's start)

    def check(self, *others: tuple[str, str | None]) -> ViewPaths:
        """Fail on an unwritable path before any work is done, these and the command's
        ``others`` ((field, path) of its other output files; no two may be one file), and on
        --share-axis without a picture whose axes it sets."""
        if self.share_axis and self.png is None and self.svg is None and self.html is None:
            raise PipeschedError("share-axis=true: add --png, --svg or --html (it sets their time axes), "
                                 "or drop --share-axis")
        check_outputs([*self._requested(), *others])
        return self

    def _requested(self) -> list[tuple[str, str]]:
        return [(field, path) for field in ("png", "svg", "trace", "html") if (path := getattr(self, field)) is not None]

    @property
    def any(self) -> bool:
        return any(getattr(self, f) is not None for f in ("png", "svg", "trace", "html"))

    def write(self, timelines: Sequence[Timeline], *, comparison: Sequence[Mapping[str, object]] | None = None,
              title: str = "", distributions: Sequence[Mapping[str, object]] | None = None,
              others: Sequence[Output] = ()) -> None:
        """Draw the views asked for and write them with the command's ``others`` files, all
        or none; say on stderr which files were written."""
        views: list[Output] = []
        if self.any:
            from pipesched.render.views import render_views

            views = render_views(timelines, png=self.png, svg=self.svg, trace=self.trace, html=self.html,
                                 comparison=comparison, title=title, distributions=distributions,
                                 share_axis=self.share_axis)
        written = write_all([*others, *views]) if views or others else []
        for path in written:
            wrote(path)


def print_timeline(timeline: Timeline, console: Console) -> None:
    from pipesched.render.terminal import timeline_view

    console.print(timeline_view(timeline, width=max(console.width, 40)))
