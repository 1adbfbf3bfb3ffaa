"""Units: the multiples of bytes (and of FLOP/s and bytes/s) the project names, each defined
once; every module that converts imports them from here."""

from __future__ import annotations

# decimal multiples (hardware data sheets: GB/s of a link, TFLOP/s of a device)
KB, MB, GB, TB, PB = 1e3, 1e6, 1e9, 1e12, 1e15
# binary multiples (memory sizes: 80 GiB of HBM)
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
