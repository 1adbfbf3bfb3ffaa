"""A ``map`` over Ray tasks, for grids and searches that outgrow one machine.

``ray_pool()`` starts a Ray of its own on this machine, reachable on the loopback address
only (nothing listens on the network), and stops it at the end of the ``with`` block;
``ray_pool(address)`` joins a running Ray cluster (``ray start --head`` on one machine,
``ray start --address ...`` on the others; pipesched installed on each) and leaves it
running. Items go to tasks in chunks; results come back in the items' order. Ray's worker
processes live as long as the Ray does, so what a worker cached (schedules, stage costs)
serves its later tasks.

Ray is an optional dependency: ``pip install 'pipesched[ray]'``. ``require_ray`` checks it
is installed without importing it. Ray takes this machine's network address as its own
unless told it runs on one machine only; ``ray_pool`` tells it so for as long as the pool
lives (for a local Ray, and for an address on the loopback), whenever Ray was imported.
A cluster that does not answer, or refuses to let this process join, is one error line:
Ray's own retries and warnings are kept off the terminal.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from pipesched.errors import PipeschedError, shorten
from pipesched.experiments.grids import Mapper

# Ray's switch for "this machine only": 0 makes it take the loopback address as this
# machine's, so its services bind to 127.0.0.1. Ray reads it from the environment once, into
# ray._private.ray_constants, when it is imported; child processes read the environment.
_LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_LOOPBACK_CONSTANT = "ENABLE_RAY_CLUSTER"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
PROBE_TIMEOUT_S = 5.0  # how long a cluster's address may take to answer
# an HTTP/2 client's first bytes (its preface and an empty SETTINGS frame); a gRPC server
# answers with a frame header of 9 bytes whose fourth, the frame type, is SETTINGS (4)
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_FRAME_HEADER = 9
_HTTP2_SETTINGS = 4
_JOIN_FIX = "start the cluster with `ray start --head` and give the address it prints (host:port)"
_TOKEN_FIX = ("the cluster asks for its authentication token: set RAY_AUTH_MODE=token and give its token "
              "(RAY_AUTH_TOKEN, or `ray get-auth-token` on the head node)")


def ray_installed() -> bool:
    """Whether Ray can be imported, found without importing it."""
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def require_ray(option: str = "--ray") -> None:
    """A PipeschedError that says how to install Ray, when it is not."""
    if not ray_installed():
        raise PipeschedError(f"{option.lstrip('-')}=not installed: {option} needs Ray; install it with "
                             "pip install 'pipesched[ray]', or use --workers N for a local process pool")


def import_ray(option: str = "--ray"):
    """The ``ray`` module, or a PipeschedError that says how to install it."""
    require_ray(option)
    import ray

    return ray


def check_address(address: str) -> tuple[str, int]:
    """(host, port) of a Ray cluster's ``host:port`` (``[::1]:6379`` for IPv6), once what
    listens there answers as Ray's control service does (gRPC: an HTTP/2 SETTINGS frame)
    within PROBE_TIMEOUT_S. Ray itself would retry an address that never answers for minutes."""
    host, _, port_text = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise PipeschedError(f"ray-address={shorten(address)}: not a host:port address; {_JOIN_FIX}")
    port = int(port_text)
    try:
        probe = socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except OSError as exc:
        raise PipeschedError(f"ray-address={shorten(address)}: nothing answers there ({_reason(exc)}); "
                             f"{_JOIN_FIX}") from None
    with probe:
        try:
            probe.sendall(_HTTP2_PREFACE)
            answer = probe.recv(_HTTP2_FRAME_HEADER)
        except OSError as exc:
            answer = _reason(exc)
    if not isinstance(answer, bytes) or len(answer) < _HTTP2_FRAME_HEADER or answer[3] != _HTTP2_SETTINGS:
        said = answer if isinstance(answer, str) else f"it answered {shorten(answer)}" if answer else "it hung up"
        raise PipeschedError(f"ray-address={shorten(address)}: what answers there is not a Ray cluster ({said}); "
                             f"{_JOIN_FIX}")
    return host, port


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


@contextmanager
def ray_pool(address: str | None = None, *, workers: int | None = None, chunksize: int = 16) -> Iterator[Mapper]:
    """A ``map`` over Ray tasks (see the module docstring); ``workers``: CPUs of a local Ray
    (default: all of this machine's)."""
    option = "--ray" if address is None else "--ray-address"
    require_ray(option)
    host = None if address is None else check_address(address)[0]
    ray = import_ray(option)
    with _this_machine_only(host is None or host in LOOPBACK):
        _join(ray, address, workers)
        try:
            if address is None:
                node = ray.util.get_node_ip_address()
                if node not in LOOPBACK:
                    raise PipeschedError(f"ray=address {node}: the local Ray did not bind to the loopback address; "
                                         "use --workers N for a local process pool")
            yield _mapper(ray, chunksize)
        finally:
            ray.shutdown()


def _join(ray, address: str | None, workers: int | None) -> None:
    """Start a local Ray (``address`` None) or join the cluster at ``address``, Ray's log
    lines held back; a failure is one PipeschedError."""
    with _held_back_logs() as held:
        try:
            if address is None:
                ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
                         configure_logging=False, _node_ip_address=LOOPBACK[0])
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, AuthenticationError
            ray.shutdown()
            field = "ray" if address is None else "ray-address"
            value = "local" if address is None else shorten(address)
            said = " ".join(str(exc).split()) or type(exc).__name__
            if "token" in said.lower() or "Unauthenticated" in held():
                raise PipeschedError(f"{field}={value}: cannot join it ({said}); {_TOKEN_FIX}") from None
            raise PipeschedError(f"{field}={value}: cannot join it ({shorten(said, 200)}); {_JOIN_FIX}") from None


@contextmanager
def _this_machine_only(local: bool) -> Iterator[None]:
    """Ray's loopback switch on while the pool lives (when ``local``): in the environment for
    the processes it starts, and in the constant this process's Ray read at import."""
    if not local:
        yield
        return
    constants = importlib.import_module("ray._private.ray_constants")
    previous_env, previous = os.environ.get(_LOOPBACK_SWITCH), getattr(constants, _LOOPBACK_CONSTANT)
    os.environ[_LOOPBACK_SWITCH] = "0"
    setattr(constants, _LOOPBACK_CONSTANT, False)
    try:
        yield
    finally:
        setattr(constants, _LOOPBACK_CONSTANT, previous)
        if previous_env is None:
            os.environ.pop(_LOOPBACK_SWITCH, None)
        else:
            os.environ[_LOOPBACK_SWITCH] = previous_env


@contextmanager
def _held_back_logs() -> Iterator[Callable[[], str]]:
    """Ray's log lines (its Python loggers and its native core, which writes to file
    descriptor 2) kept in a file while the block runs; yields a function that reads them."""
    logger = logging.getLogger("ray")
    level = logger.level
    logger.setLevel(logging.ERROR)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)

        def read() -> str:
            held.seek(0)
            return held.read().decode(errors="replace")

        try:
            yield read
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            logger.setLevel(level)


def _mapper(ray, chunksize: int) -> Mapper:
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

    return mapped


def _apply(function: Callable, items: list) -> list:
    """One Ray task: ``function`` over a chunk of items."""
    return [function(item) for item in items]
