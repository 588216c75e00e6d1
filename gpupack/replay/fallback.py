"""TEMPORARY: a gated pod judged unplaceable without the controller's word, by counting its cycles.

The controller says why a gated pod waits with the pod condition of
``sharing.placement_status`` (written from ``controller.wait_status``). Until a
controller writes it, the replay falls back on this rule, and only for a gated
pod that carries no placement condition at all:

    the pod is unplaceable once the controller has completed ``cycles``
    planning cycles (its ``gpupack_controller_cycle_seconds_count``) while
    every GPUNode stayed converged (``status.observedGeneration`` at least
    ``metadata.generation``) and none changed its spec (the same generations
    at both ends), and the pod is still gated.

A cycle that plans a change writes a GPUNode spec (a new generation), which
restarts the count; a change in flight is not converged, which holds it. So
the rule declares a pod only after cycles that planned nothing for it on a
quiet cluster, which is the controller's own ``NoCapacity``, observed from
outside at the price of a few cycles per such pod. It is to be deleted once
the controller writes the condition; the replay reports how many pods each
rule decided (``unplaceable_by``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Fingerprint = tuple[tuple[str, int], ...]


def gpunode_state(gpunodes: Iterable[Mapping[str, Any]]) -> tuple[bool, Fingerprint]:
    """Whether every GPUNode is converged, and their generations (name, generation), sorted."""
    converged = True
    generations = []
    for obj in gpunodes:
        meta = obj.get("metadata") or {}
        generation = int(meta.get("generation") or 0)
        observed = int((obj.get("status") or {}).get("observedGeneration") or 0)
        converged = converged and observed >= generation
        generations.append((str(meta.get("name") or ""), generation))
    return converged, tuple(sorted(generations))


@dataclass
class CycleCount:
    """The rule for one pod: fed observations, says when the pod counts as unplaceable."""

    cycles: int = 3
    _start: int | None = None
    _fingerprint: Fingerprint | None = None

    def observe(self, cycles_done: int, converged: bool, fingerprint: Fingerprint) -> bool:
        """One look (controller cycles completed so far, the GPUNodes' state); True when the pod is
        declared unplaceable by the rule."""
        if not converged or fingerprint != self._fingerprint or self._start is None:
            self._start = cycles_done if converged else None
            self._fingerprint = fingerprint if converged else None
            return False
        return cycles_done - self._start >= self.cycles
