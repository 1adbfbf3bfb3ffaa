"""The local process pool of the experiments layer: order kept, one worker per schedule, stopped at
once when left by an exception."""

from __future__ import annotations

import os
import time

import pytest

from pipesched.experiments import Point, process_map


def _pid_and_m(point: Point) -> tuple[int, int]:
    return os.getpid(), point.m


def _square(x: int) -> int:
    return x * x


def test_results_come_in_the_order_of_the_items() -> None:
    with process_map(2, chunksize=3) as mapper:
        assert list(mapper(_square, range(50))) == [x * x for x in range(50)]


def test_points_that_share_a_schedule_go_to_one_worker_in_every_call() -> None:
    points = [Point(family, p=4, m=m, latency=latency) for family in ("1f1b", "zb-h1", "gpipe")
              for m in (4, 8, 12) for latency in (0.0, 1e-6, 1e-5)]
    with process_map(2, chunksize=2) as mapper:
        first = list(mapper(_pid_and_m, points))
        second = list(mapper(_pid_and_m, points))
    assert [m for _, m in first] == [p.m for p in points]
    worker = {}
    for point, (pid, _), (again, _) in zip(points, first, second, strict=True):
        key = (point.family, point.m)
        assert worker.setdefault(key, pid) == pid == again, key
    assert len({pid for pid, _ in first}) == 2  # both workers used


def _pid_after_a_while(x: int) -> int:
    time.sleep(0.05)
    return os.getpid()


def test_the_workers_share_a_grid_evenly() -> None:
    """Each schedule's points go to one worker, and the workers' work (the table sizes p x m
    x v of their points) differs by at most one schedule's: a schedule first met goes to
    the worker given the least so far."""
    points = [Point(family, p=p, m=m, v=v, latency=latency) for family in ("interleaved-1f1b", "looped-bfs")
              for p in (2, 4) for m in (4, 8, 16) for v in (2, 4) for latency in (0.0, 1e-6, 1e-5)]
    with process_map(2, chunksize=4) as mapper:
        pids = [pid for pid, _ in mapper(_pid_and_m, points)]
    work: dict[int, int] = {}
    schedule_work: dict[tuple, int] = {}
    for point, pid in zip(points, pids, strict=True):
        size = point.p * point.m * point.v
        work[pid] = work.get(pid, 0) + size
        key = (point.family, point.p, point.m, point.v)
        schedule_work[key] = schedule_work.get(key, 0) + size
    assert len(work) == 2
    assert max(work.values()) - min(work.values()) <= max(schedule_work.values())


@pytest.mark.slow
def test_a_pool_left_by_an_exception_stops_at_once() -> None:
    # 100 items of 50 ms on 2 workers: 2.5 s of work queued when the first result comes
    with pytest.raises(KeyboardInterrupt), process_map(2) as mapper:
        for pid in mapper(_pid_after_a_while, range(100)):
            workers = [pid]
            stopped = time.monotonic()
            raise KeyboardInterrupt
    assert time.monotonic() - stopped < 1.0
    with pytest.raises(ProcessLookupError):
        os.kill(workers[0], 0)  # the worker is gone (and reaped)
