"""The preemptor's record ``gpupack.io/preempting``: the uids of the pods gpupack preempted for it, and where.

gpupack's controller writes it on a pod it preempts for before it deletes any victim
(``controller.writes.preemption``), and reads it every cycle (``controller.state``) so that a
preemptor waits for its victims and never preempts twice; the live replay reads it to know a pod
kube-scheduler left Unschedulable still waits for its place (``gpupack.replay.outcome``). This
module is the one reading and writing of the text.

The text is the victims' uids joined by commas (``uid-a,uid-b``), as it always was for a pod
gpupack gates: its node is the one it is pinned to. A pod gpupack does not gate (one asking
``nvidia.com/gpu`` itself, which kube-scheduler places) cannot be pinned (its affinity is
immutable), so its record also names the node reclaimed for it, after an ``@``
(``uid-a,uid-b@node-1``): neither a uid nor a node name (a DNS subdomain) holds ``@`` or ``,``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sharing.api.keys import PREEMPTING_ANNOTATION

__all__ = ["PreemptingRecord", "preempting_text", "read_preempting"]


@dataclass(frozen=True)
class PreemptingRecord:
    """What a preemptor's record says."""

    victims: tuple[str, ...]
    """The uids of the pods preempted for it."""
    node: str | None = None
    """The node freed for it, when the record names one (a pod gpupack does not gate)."""


def read_preempting(annotations: Mapping[str, Any] | None) -> PreemptingRecord | None:
    """The record in a pod's annotations; None when it has none (or not as text). Empty uids are
    skipped; an empty node after ``@`` reads as none."""
    text = (annotations or {}).get(PREEMPTING_ANNOTATION)
    if not isinstance(text, str):
        return None
    uids, at, node = text.partition("@")
    victims = tuple(uid for uid in (part.strip() for part in uids.split(",")) if uid)
    return PreemptingRecord(victims, node.strip() or None if at else None)


def preempting_text(record: PreemptingRecord) -> str:
    """The annotation's value for ``record`` (ValueError for a node name that would not read back)."""
    text = ",".join(record.victims)
    if record.node is None:
        return text
    if not record.node or "@" in record.node or "," in record.node:
        raise ValueError(f"node name {record.node!r} cannot be recorded in {PREEMPTING_ANNOTATION}")
    return f"{text}@{record.node}"
