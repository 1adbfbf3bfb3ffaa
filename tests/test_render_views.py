"""write_views: all outputs at once, paths checked first, files all or nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.render import views
from pipesched.render.views import write_views
from pipesched.slots import slot_table
from render_timelines import with_transfers


@pytest.fixture(scope="module")
def timelines():
    return [with_transfers(generate("1f1b", 3, 4)), slot_table(generate("gpipe", 3, 4))]


@pytest.mark.slow
def test_writes_every_requested_view(tmp_path: Path, timelines) -> None:
    paths = dict(png=tmp_path / "a.png", svg=tmp_path / "a.svg", trace=tmp_path / "a.json", html=tmp_path / "a.html")
    written = write_views(timelines, **paths, title="two", comparison=[{"schedule": "1f1b"}])
    assert written == list(paths.values())
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["svg"].read_text().lstrip().startswith("<?xml")
    assert len(json.loads(paths["trace"].read_text())["traceEvents"]) > len(timelines[0]) + len(timelines[1])
    assert paths["html"].read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.json", "a.png", "a.svg"]


def test_only_requested_views_are_written(tmp_path: Path, timelines) -> None:
    assert write_views(timelines, trace=tmp_path / "t.json") == [tmp_path / "t.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_missing_directory_fails_before_any_work(tmp_path: Path, timelines, monkeypatch) -> None:
    drawn = []
    monkeypatch.setattr(views, "_render", lambda *args: drawn.append(args) or b"")
    missing = tmp_path / "nowhere" / "report.html"
    with pytest.raises(PipeschedError) as error:
        write_views(timelines, png=tmp_path / "ok.png", html=missing)
    message = str(error.value)
    assert message.startswith(f"html={missing}: directory") and "\n" not in message
    assert drawn == []  # checked before rendering anything
    assert list(tmp_path.iterdir()) == []  # not even the good path was written


def unwritable_directory(tmp_path: Path) -> Path:
    """A directory this process cannot write: a read-only one, or for root (whom file modes
    do not stop) a process's /proc entry."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        folder.chmod(0o755)
        return Path("/proc/self")
    return folder


def test_unwritable_directory_is_one_line_and_leaves_nothing(tmp_path: Path, timelines) -> None:
    folder = unwritable_directory(tmp_path)
    before = set(folder.iterdir())
    with pytest.raises(PipeschedError) as error:
        write_views(timelines, svg=folder / "gantt.svg")
    assert str(error.value).startswith(f"svg={folder / 'gantt.svg'}: directory") and "not writable" in str(error.value)
    assert set(folder.iterdir()) == before


def test_a_failing_render_writes_none_of_the_views(tmp_path: Path, timelines, monkeypatch) -> None:
    def half_written(field, *args, **options):
        if field == "html":
            raise PipeschedError("html=x: boom")
        return b"ok"

    monkeypatch.setattr(views, "_render", half_written)
    with pytest.raises(PipeschedError, match="boom"):
        write_views(timelines, png=tmp_path / "a.png", html=tmp_path / "a.html")
    # the views are written all or none: not the png drawn first, and no temporary file
    assert list(tmp_path.iterdir()) == []


def test_output_path_that_is_a_directory(tmp_path: Path, timelines) -> None:
    with pytest.raises(PipeschedError, match=r"^trace=.*: is a directory"):
        write_views(timelines, trace=tmp_path)


def test_no_timelines_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(PipeschedError, match=r"^timelines=0: "):
        write_views([], png=tmp_path / "a.png")
