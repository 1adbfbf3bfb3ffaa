"""Passes: ``Schedule -> Schedule``-shaped transformations of a table (its communication)."""

from __future__ import annotations

from pipesched.passes.communication import (
    AllReduce,
    CommSchedule,
    Message,
    Recv,
    Send,
    with_communication,
)

__all__ = ["AllReduce", "CommSchedule", "Message", "Recv", "Send", "with_communication"]
