"""The reconfiguration journal: what the MIG reconciler is doing to one GPU.

The journal is written to ``GPUNode.status.reconfiguration`` *before* the first
NVML call of a reconfiguration and after every step, so it survives a crash or a
kill of the agent. It records intent (previous layout, target layout, the plan),
not progress counters the recovery depends on: after a restart the reconciler
re-derives the next step from what NVML reports (see ``node.layouts.reconciler.decide``),
which makes every step idempotent. ``steps`` is a human-readable log for SREs.

Phases::

    Applying ──(all steps done)──────────────▶ Advertising ─▶ Succeeded
       │ (NVML error, instance became busy)         ▲
       ▼                                            │
    RollingBack ──(previous layout restored)────────┘ ─▶ RolledBack
       │ (cannot restore without touching a busy instance, or too many errors)
       └──────────────────────────────────────────────── ─▶ Failed

``Advertising`` means NVML is done and the device plugin is being made to
re-advertise (``outcome`` holds the final phase to enter afterwards). ``Aborted``
means the GPU was changed by someone else mid-way; the next cycle re-plans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

from mig.model import PlacedInstance, Placement

Phase = Literal["Applying", "RollingBack", "Advertising", "Succeeded", "RolledBack", "Failed", "Aborted"]
PHASES: tuple[Phase, ...] = ("Applying", "RollingBack", "Advertising", "Succeeded", "RolledBack", "Failed", "Aborted")
NVML_PHASES: frozenset[Phase] = frozenset({"Applying", "RollingBack"})
TERMINAL_PHASES: frozenset[Phase] = frozenset({"Succeeded", "RolledBack", "Failed", "Aborted"})
MAX_LOGGED_STEPS = 40  # keeps the status object small; the Events carry the rest


def format_instance(instance: PlacedInstance) -> str:
    return f"{instance.profile}@{instance.placement.start}:{instance.placement.size}"


def parse_instance(text: str) -> PlacedInstance:
    """Inverse of ``format_instance``: ``1g.18gb@3:1``."""
    try:
        profile, where = text.rsplit("@", 1)
        start, size = where.split(":")
        return PlacedInstance(profile, Placement(int(start), int(size)))
    except ValueError:
        raise ValueError(f"bad instance {text!r} in journal; expected PROFILE@START:SIZE") from None


@dataclass(frozen=True)
class Journal:
    gpu_uuid: str
    gpu_index: int
    generation: int
    """``GPUNode`` spec generation this reconfiguration implements."""
    previous: tuple[PlacedInstance, ...]
    target: tuple[PlacedInstance, ...]
    destroy: tuple[PlacedInstance, ...]
    create: tuple[PlacedInstance, ...]
    phase: Phase
    started_at: float
    updated_at: float
    outcome: Phase | None = None
    reason: str = ""
    errors: int = 0
    """NVML errors met so far (rollback gives up after the configured number)."""
    device_plugin_paused: bool = False
    device_plugin_label: str | None = "true"
    """Value of ``nvidia.com/gpu.deploy.device-plugin`` before the pause (None: absent), restored after."""
    steps: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL_PHASES

    def moved(self, phase: Phase, now: float, reason: str | None = None, **changes: Any) -> Journal:
        log = f"{phase}" + (f": {reason}" if reason else "")
        return replace(
            self, phase=phase, updated_at=now, reason=self.reason if reason is None else reason,
            steps=_append(self.steps, log), **changes,
        )

    def logged(self, step: str, now: float, **changes: Any) -> Journal:
        return replace(self, updated_at=now, steps=_append(self.steps, step), **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpuUUID": self.gpu_uuid,
            "gpuIndex": self.gpu_index,
            "generation": self.generation,
            "previous": [format_instance(i) for i in self.previous],
            "target": [format_instance(i) for i in self.target],
            "destroy": [format_instance(i) for i in self.destroy],
            "create": [format_instance(i) for i in self.create],
            "phase": self.phase,
            "outcome": self.outcome,
            "reason": self.reason,
            "errors": self.errors,
            "devicePluginPaused": self.device_plugin_paused,
            # No nulls in the CRD (they are pruned): an absent label is said by its own field.
            **({"devicePluginLabel": self.device_plugin_label} if self.device_plugin_label is not None
               else {"devicePluginLabelAbsent": True}),
            "startedAt": self.started_at,
            "updatedAt": self.updated_at,
            "steps": list(self.steps),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Journal:
        try:
            phase = raw["phase"]
            if phase not in PHASES:
                raise ValueError(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
            outcome = raw.get("outcome")
            if outcome is not None and outcome not in PHASES:
                raise ValueError(f"unknown outcome {outcome!r}")
            return cls(
                gpu_uuid=str(raw["gpuUUID"]),
                gpu_index=int(raw["gpuIndex"]),
                generation=int(raw["generation"]),
                previous=tuple(parse_instance(t) for t in raw["previous"]),
                target=tuple(parse_instance(t) for t in raw["target"]),
                destroy=tuple(parse_instance(t) for t in raw["destroy"]),
                create=tuple(parse_instance(t) for t in raw["create"]),
                phase=cast(Phase, phase),
                outcome=cast("Phase | None", outcome),
                reason=str(raw.get("reason", "")),
                errors=int(raw.get("errors", 0)),
                device_plugin_paused=bool(raw.get("devicePluginPaused", False)),
                device_plugin_label=None if raw.get("devicePluginLabelAbsent") or raw.get("devicePluginLabel", "true") is None
                else str(raw.get("devicePluginLabel", "true")),
                started_at=float(raw["startedAt"]),
                updated_at=float(raw["updatedAt"]),
                steps=tuple(str(s) for s in raw.get("steps", ())),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed reconfiguration journal: missing or bad field {exc}") from None


def _append(steps: tuple[str, ...], step: str) -> tuple[str, ...]:
    return (steps + (step,))[-MAX_LOGGED_STEPS:]
