"""Per-process utilisation samples, read once per poll for each GPU NVML can sample.

Each read asks for the samples newer than the newest one the previous read returned
(NVML's ``lastSeenTimeStamp``), so no period is counted twice; the first read of a GPU
takes what NVML still buffers. MIG-enabled GPUs are skipped (NVML answers NOT_SUPPORTED
there; their instances' use comes from DCGM), as are GPUs without a process (nothing to
sample) and GPUs the snapshot could not read.

An NVML error leaves that GPU without samples for this poll (its shared pods are then
unattributed, ``node.usage.attribution``) and is logged once, when it begins; that it
ended is logged once too. The agent goes on.
"""

from __future__ import annotations

import logging

from node.base.snapshot import NodeSnapshot
from node.nvml.errors import NvmlError
from node.nvml.protocol import UsageReader
from node.usage.attribution import SampleRead

log = logging.getLogger("gpupack.agent")


class ProcessSampler:
    """Reads each GPU's samples since its last read; keeps, per GPU UUID, the newest timestamp seen
    and the NVML error in force (so it is logged once)."""

    def __init__(self) -> None:
        self._since: dict[str, int] = {}
        self._failing: dict[str, str] = {}

    def read(self, reader: UsageReader, snapshot: NodeSnapshot) -> dict[int, SampleRead]:
        """GPU index -> its samples, or the NVML error that kept them from being read."""
        found: dict[int, SampleRead] = {}
        for gpu in snapshot.gpus:
            if gpu.error is not None or gpu.info.mig_enabled:
                continue
            index, uuid = gpu.info.index, gpu.info.uuid
            if not gpu.processes:
                found[index] = ()
                continue
            try:
                samples = reader.process_utilization(index, self._since.get(uuid, 0))
            except NvmlError as exc:
                if self._failing.get(uuid) != exc.name:
                    log.warning("GPU %d: per-process utilisation unreadable (%s); the use of pods sharing it is "
                                "unattributed until it can be read", index, exc)
                self._failing[uuid] = exc.name
                found[index] = str(exc)
                continue
            if self._failing.pop(uuid, None) is not None:
                log.info("GPU %d: per-process utilisation readable again", index)
            if samples:
                self._since[uuid] = max(self._since.get(uuid, 0), *(s.timestamp_us for s in samples))
            found[index] = samples
        return found
