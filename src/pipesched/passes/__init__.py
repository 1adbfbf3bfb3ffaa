"""Passes: ``Schedule -> Schedule``-shaped transformations of a table: its communication, its
frozen stages, its activation offloads."""

from __future__ import annotations

from pipesched.passes.communication import (
    AllReduce,
    CommSchedule,
    Message,
    Recv,
    Send,
    with_communication,
)
from pipesched.passes.freeze import freeze
from pipesched.passes.offload import OffloadPolicy, offload

__all__ = ["AllReduce", "CommSchedule", "Message", "OffloadPolicy", "Recv", "Send", "freeze", "offload",
           "with_communication"]
