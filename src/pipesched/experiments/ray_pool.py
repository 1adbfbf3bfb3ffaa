"""A ``map`` over Ray tasks, for grids and searches that outgrow one machine.

``ray_pool()`` starts a Ray of its own on this machine, reachable on the loopback address
only (nothing listens on the network), and stops it at the end of the ``with`` block;
``ray_pool(address)`` joins a running Ray cluster (``ray start --head`` on one machine,
``ray start --address ...`` on the others; pipesched installed on each) and leaves it
running. Items go to tasks in chunks; results come back in the items' order. Ray's worker
processes live as long as the Ray does, so what a worker cached (schedules, stage costs)
serves its later tasks.

Ray is an optional dependency: ``pip install 'pipesched[ray]'``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from pipesched.errors import PipeschedError
from pipesched.experiments.grid import Mapper

# Ray reads this when it is imported: 0 makes it take the loopback address as this
# machine's, so a Ray started here binds its services to 127.0.0.1
_LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def import_ray(option: str = "--ray"):
    """The ``ray`` module, or a PipeschedError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise PipeschedError(f"{option.lstrip('-')}=not installed: {option} needs Ray; install it with "
                             "pip install 'pipesched[ray]', or use --workers N for a local process pool") from None
    return ray


@contextmanager
def ray_pool(address: str | None = None, *, workers: int | None = None, chunksize: int = 16) -> Iterator[Mapper]:
    """A ``map`` over Ray tasks (see the module docstring); ``workers``: CPUs of a local Ray
    (default: all of this machine's)."""
    local = address is None
    if local:
        previous = os.environ.get(_LOOPBACK_SWITCH)
        os.environ[_LOOPBACK_SWITCH] = "0"
    try:
        ray = import_ray("--ray" if local else "--ray-address")
        try:
            if local:
                ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise PipeschedError(f"ray-address={address}: cannot join it ({str(exc).splitlines()[0]}); start the "
                                 "cluster with `ray start --head` and give its address") from None
    finally:
        if local:
            if previous is None:
                os.environ.pop(_LOOPBACK_SWITCH, None)
            else:
                os.environ[_LOOPBACK_SWITCH] = previous
    try:
        if local:
            node = ray.util.get_node_ip_address()
            if node not in LOOPBACK:
                raise PipeschedError(f"ray=address {node}: the local Ray did not bind to the loopback address (Ray "
                                     "was imported before pipesched started it); run the search in a new process")
        remote = ray.remote(_apply)

        def mapped(function: Callable, items: Iterable) -> Iterator:
            items = list(items)
            if not items:
                return
            shared = ray.put(function)
            size = max(1, min(chunksize, len(items) // max(1, int(ray.cluster_resources().get("CPU", 1)))))
            tasks = [remote.remote(shared, items[k:k + size]) for k in range(0, len(items), size)]
            for task in tasks:
                yield from ray.get(task)

        yield mapped
    finally:
        ray.shutdown()


def _apply(function: Callable, items: list) -> list:
    """One Ray task: ``function`` over a chunk of items."""
    return [function(item) for item in items]
