"""Read one tick's fault signals from the NVML backend (the only I/O of ``node.health``).

Never raises for NVML trouble: an XID read that fails is reported as such
(``Signals.xid_error``), a GPU whose memory query answers ``GPU_IS_LOST`` is lost,
and any other failing query simply gives no memory signal for that GPU this tick
(it is logged once per change by the caller's warnings).
"""

from __future__ import annotations

from node.health.tracker import Signals
from node.nvml.errors import GPU_IS_LOST, NvmlError
from node.nvml.protocol import HealthReader, MemoryHealth
from node.base.snapshot import NodeSnapshot


def read_signals(backend: HealthReader, snapshot: NodeSnapshot) -> tuple[Signals, tuple[str, ...]]:
    """The signals, and warnings about queries that failed."""
    warnings: list[str] = []
    xid_error = None
    try:
        xids = backend.xid_events()
    except NvmlError as exc:
        xids, xid_error = (), str(exc)
    memory: dict[int, MemoryHealth] = {}
    lost = {g.info.index for g in snapshot.gpus if g.lost}
    markers: dict[int, str] = {}
    for gpu in snapshot.gpus:
        index = gpu.info.index
        if index in lost:
            continue
        try:
            memory[index] = backend.memory_health(index)
            markers[index] = backend.reset_marker(index)
        except NvmlError as exc:
            if exc.code == GPU_IS_LOST:
                lost.add(index)
            else:
                warnings.append(f"GPU {index}: memory health unreadable: {exc}")
    return Signals(xids, xid_error, memory, frozenset(lost), backend.boot_id(), markers), tuple(warnings)
