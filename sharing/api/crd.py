"""gpupack's custom resources (group ``gpupack.io``, version ``v1alpha1``): the CRD models, in pydantic.

These models are the single source of truth for the custom resources: the CRD
OpenAPI schemas in ``manifests/crds/`` are generated from them
(``python -m gpupack.devcluster.crdgen --write``) and a unit test fails when the
committed YAML drifts from what the models generate.

Conventions, chosen so that a model and its CRD accept exactly the same objects:

* Python attributes are snake_case, the wire format is camelCase (aliases);
  parse with ``Model.model_validate(obj)``, serialize with :func:`to_wire`.
* Every model forbids unknown fields (``extra="forbid"``), except
  :class:`ReconfigurationStatus`, the node agent's journal, which it may extend.
* ``None`` means "absent": the CRD fields are optional, not nullable, and
  :func:`to_wire` drops ``None`` values (the API server prunes nulls anyway).
* Cross-field rules live twice, as a ``model_validator`` here and as a CEL rule
  (``x-kubernetes-validations``) in the schema, so the API server enforces them
  too; the unit tests check both reject the same objects.

Pure data: no Kubernetes client import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from mig.units import parse_quantity
from sharing.api.modes import MODES, Mode, NodeSharingMode

GROUP = "gpupack.io"
VERSION = "v1alpha1"
API_VERSION: Literal["gpupack.io/v1alpha1"] = "gpupack.io/v1alpha1"

# Device-plugin sharing strategies a GPUNode can run (node-wide, like the
# NVIDIA device plugin's config) and the modes a namespace may be allowed.
Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
WEEKDAYS: tuple[Weekday, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

# A MIG GPU-instance profile as the device plugin names it (mixed strategy):
# "1g.10gb", "3g.40gb", "1g.10gb+me", "1g.24gb+gfx", ...
MIG_PROFILE_PATTERN = r"^[1-8]g\.[0-9]+gb(\+[a-z]+(\.[a-z]+)?)?$"
# A mig-parted config name (a key of its config file, e.g. "all-balanced").
MIG_CONFIG_PATTERN = r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$"
# A Kubernetes binary-SI quantity of memory, e.g. "10Gi" or "512Mi".
MEMORY_QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"
HHMM_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
# metav1.Condition's own validation patterns (k8s.io/apimachinery types.go).
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
POD_REF_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

MAX_GPUS_PER_NODE = 16  # HGX-2 class machines carry 16 GPUs
MAX_MIG_INSTANCES = 7  # at most 7 GPU instances per GPU on every MIG-capable model
MAX_SHARING_REPLICAS = 64
MAX_SHARED_IN_USE = MAX_SHARING_REPLICAS * MAX_GPUS_PER_NODE
"""Replicas a node's pods can hold at most (``status.sharing.inUse``)."""


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL rules for the CRD schema (``x-kubernetes-validations``)."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def _list_map(*keys: str) -> dict[str, Any]:
    """A list the API server treats as a map keyed by ``keys`` (unique, mergeable)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields rejected.

    Strict, because the API server does not coerce either: ``replicas: "4"`` is
    an error there, so it must be one here (timestamps opt out: on the wire
    they are RFC 3339 strings).
    """

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, strict=True
    )


def _unique(items: list[Any], key: str, where: str) -> None:
    """Reject duplicate keys of a list the CRD declares as a list-map."""
    seen: set[Any] = set()
    for item in items:
        value = getattr(item, key)
        if value in seen:
            raise ValueError(f"{where}: duplicate {key} {value!r}")
        seen.add(value)


def to_wire(model: BaseModel) -> dict[str, Any]:
    """The JSON-ready dict the API server expects: camelCase, ``None`` dropped."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------- GPUNode spec


class SharingConfig(ApiModel):
    """Node-wide device-plugin sharing: one strategy for all full GPUs of the node."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.mode != 'none' || self.replicas == 1", "replicas must be 1 when mode is none"),
        )
    )
    mode: NodeSharingMode = Field("none", description="Sharing strategy of full GPUs.")
    replicas: int = Field(
        1, ge=1, le=MAX_SHARING_REPLICAS, description="Shares advertised per GPU (1..64)."
    )

    @model_validator(mode="after")
    def _replicas_need_a_mode(self) -> SharingConfig:
        if self.mode == "none" and self.replicas != 1:
            raise ValueError("replicas must be 1 when mode is none")
        return self


class SharingStatus(SharingConfig):
    """The node's sharing as the agent applied it, and how many of its replicas pods hold."""

    in_use: int = Field(
        0, ge=0, le=MAX_SHARED_IN_USE,
        description="Shared replicas (nvidia.com/gpu.shared) held by the pods bound to the node: what the "
                    "webhook's choice of a mode for an auto pod counts as taken.",
    )


class MigInstanceSpec(ApiModel):
    """One desired GPU instance: a profile, optionally pinned to a placement start."""

    profile: str = Field(pattern=MIG_PROFILE_PATTERN, max_length=32, description="e.g. 1g.10gb")
    start: int | None = Field(
        None, ge=0, le=7, description="First memory slice; absent lets the agent choose."
    )


class GPUSpec(ApiModel):
    """Desired state of one GPU: MIG on/off and either a layout or a mig-parted config."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!(has(self.layout) && has(self.migConfig))", "set layout or migConfig, not both"),
            (
                "self.migEnabled || (!has(self.layout) && !has(self.migConfig))",
                "layout and migConfig need migEnabled: true",
            ),
        )
    )
    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE, description="NVML device index.")
    mig_enabled: bool = Field(False, description="Whether MIG mode should be on.")
    layout: list[MigInstanceSpec] | None = Field(
        None, max_length=MAX_MIG_INSTANCES, description="Explicit MIG geometry."
    )
    mig_config: str | None = Field(
        None, pattern=MIG_CONFIG_PATTERN, description="Named mig-parted config, e.g. all-balanced."
    )

    @model_validator(mode="after")
    def _one_geometry_source(self) -> GPUSpec:
        if self.layout is not None and self.mig_config is not None:
            raise ValueError("set layout or migConfig, not both")
        if not self.mig_enabled and (self.layout is not None or self.mig_config is not None):
            raise ValueError("layout and migConfig need migEnabled: true")
        return self


class GPUNodeSpec(ApiModel):
    """Desired state of a node's GPUs, written by the controller, applied by the agent."""

    sharing: SharingConfig = Field(default_factory=SharingConfig)
    gpus: Annotated[
        list[GPUSpec], Field(json_schema_extra=_list_map("index"))
    ] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)

    @model_validator(mode="after")
    def _unique_gpus(self) -> GPUNodeSpec:
        _unique(self.gpus, "index", "gpus")
        return self


# -------------------------------------------------------------- GPUNode status


HealthRecovery = Literal["ResetGpu", "RebootNode", "Acknowledge"]
"""What must happen before a failed GPU or instance is healthy again (never a timer alone):
``ResetGpu`` a GPU reset (or a reboot) seen by the node agent, ``RebootNode`` a reboot of the
node, ``Acknowledge`` an admin's acknowledgement on the GPUNode (``gpupack.io/health-acknowledged``,
e.g. after the GPU was replaced). An acknowledgement ends any fault."""

HEALTH_REASON_PATTERN = r"^[A-Z][A-Za-z0-9]*$"


class DeviceHealth(ApiModel):
    """A fault of a GPU or of one MIG instance, as the node agent found it (present only while it lasts).

    Written by the node agent (``node.health``), read through ``sharing.api.gpunode``: the
    controller plans nothing on the device and the webhook counts none of its capacity."""

    reason: str = Field(pattern=HEALTH_REASON_PATTERN, max_length=64,
                        description="e.g. Xid79, UnknownXid, EccUncorrectable, RowRemapFailure, GpuLost.")
    message: str = Field(max_length=1024)
    xid: int | None = Field(None, ge=0, le=65535, description="The XID that caused it, when one did.")
    since: datetime = Field(strict=False, description="When the agent saw the fault begin.")
    recovery: HealthRecovery
    withdrawn: bool = Field(
        False, description="The NVIDIA device plugin withdraws the device itself for this fault (a critical XID "
                           "matched to the device, a lost GPU); otherwise it keeps advertising it and gpupack keeps "
                           "new pods off the node (status.summary.degraded, label gpupack.io/gpu-degraded).")
    pods: list[Annotated[str, Field(pattern=POD_REF_PATTERN, max_length=317)]] = Field(
        default_factory=list, max_length=MAX_SHARING_REPLICAS,
        description="namespace/name of the pods that were using the device when it failed.")
    boot_id: str | None = Field(None, max_length=64, description="The node's boot id when the fault began.")
    reset_marker: str | None = Field(
        None, max_length=64, description="The GPU's reset marker when the fault began: a reset changes it.")


MemorySignal = Literal["RetiredPagesPending", "RowRemapPending", "RowRemapFailure"]


class MemorySignalsSeen(ApiModel):
    """The node agent's last look at a GPU's memory signals: a signal raises a fault when it comes
    up (or its counter grows), not again while it stays. Kept here so a restarted agent goes on
    from where its predecessor was: an acknowledged signal stays acknowledged, and one that came
    up while no agent ran is still new."""

    reset_marker: str = Field("", max_length=64)
    volatile_uncorrected: int | None = Field(None, ge=0)
    aggregate_uncorrected: int | None = Field(None, ge=0)
    up: list[MemorySignal] = Field(default_factory=list, max_length=3)


class MigInstanceStatus(ApiModel):
    """An existing GPU instance as NVML reports it, and who uses it."""

    profile: str = Field(pattern=MIG_PROFILE_PATTERN, max_length=32)
    start: int = Field(ge=0, le=7)
    size: int = Field(ge=1, le=8, description="Memory slices occupied.")
    uuid: str | None = Field(None, max_length=64, description="MIG-<uuid> of the device.")
    in_use: bool = False
    pods: list[Annotated[str, Field(pattern=POD_REF_PATTERN, max_length=317)]] = Field(
        default_factory=list, max_length=MAX_SHARING_REPLICAS, description="namespace/name"
    )
    gi_id: int | None = Field(None, ge=0, le=64, description="NVML's GPU-instance id (XIDs name it).")
    health: DeviceHealth | None = Field(None, description="Present while the instance is unhealthy.")


class GPUUtilization(ApiModel):
    """Latest utilization sample; ``gpu_percent`` is absent when NVML cannot say."""

    gpu_percent: int | None = Field(None, ge=0, le=100)
    memory_used_mib: int = Field(0, ge=0, alias="memoryUsedMiB")


LayoutRefusalPhase = Literal["Refused", "Failed", "Aborted"]
"""Why the agent gave up on a GPU's requested layout: ``Refused`` (not attempted: the
policy forbids it, it needs a MIG-mode change the agent cannot make, NVML failed),
``Failed`` or ``Aborted`` (attempted, and the GPU was rolled back)."""


class LayoutRefusal(ApiModel):
    """The node agent will not carry out this GPU's requested layout for spec ``generation``.

    It does not try again until the spec changes, so the controller may ask for
    another layout, and the GPU holds no ``maxConcurrent`` slot. Written by the
    agent (``node/``), read by the controller (``controller/state/build.py``).
    """

    phase: LayoutRefusalPhase
    reason: str = Field(max_length=1024)
    generation: int = Field(ge=0, description="metadata.generation of the GPUNode spec this answers.")


class GPUStatus(ApiModel):
    """Observed state of one GPU."""

    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    uuid: str = Field(max_length=64, description="GPU-<uuid>")
    product: str = Field(max_length=128, description="GPU feature discovery product name.")
    memory_mib: int = Field(ge=0, alias="memoryMiB")
    mig_enabled: bool = False
    instances: list[MigInstanceStatus] = Field(default_factory=list, max_length=MAX_MIG_INSTANCES)
    utilization: GPUUtilization | None = None
    layout_refusal: LayoutRefusal | None = None
    health: DeviceHealth | None = Field(None, description="Present while the GPU is unhealthy.")
    memory_signals: MemorySignalsSeen | None = None


class Condition(ApiModel):
    """The standard ``metav1.Condition`` shape."""

    type: str = Field(pattern=CONDITION_TYPE_PATTERN, max_length=316)
    status: Literal["True", "False", "Unknown"]
    observed_generation: int | None = Field(None, ge=0)
    last_transition_time: datetime = Field(strict=False)
    reason: str = Field(pattern=CONDITION_REASON_PATTERN, min_length=1, max_length=1024)
    message: str = Field(max_length=32768)


_InstanceText = Annotated[str, Field(max_length=64)]
"""One MIG instance as the journal writes it: ``PROFILE@START:SIZE``."""
_LongText = Annotated[str, Field(max_length=32768)]


class ReconfigurationPlanStep(ApiModel):
    """One step of a reconfiguration: destroy or create one instance, or apply a mig-manager config."""

    op: Literal["destroy", "create", "mig-config"]
    instance: _InstanceText | None = None
    gpus: list[Annotated[int, Field(ge=0, le=63)]] | None = Field(None, max_length=64)


class ReconfigurationJournal(ApiModel):
    """The direct mode's journal of one GPU's reconfiguration (``node.base.journal.Journal``'s wire form)."""

    gpu_uuid: str = Field(alias="gpuUUID", max_length=128)
    gpu_index: int = Field(ge=0, le=63)
    generation: int = Field(ge=0)
    previous: list[_InstanceText] = Field(default_factory=list, max_length=64)
    target: list[_InstanceText] = Field(default_factory=list, max_length=64)
    destroy: list[_InstanceText] = Field(default_factory=list, max_length=64)
    create: list[_InstanceText] = Field(default_factory=list, max_length=64)
    phase: str = Field(max_length=64)
    outcome: str | None = Field(None, max_length=64)
    reason: _LongText = ""
    errors: int = Field(0, ge=0)
    device_plugin_paused: bool = False
    device_plugin_label: str | None = Field(
        None, max_length=63, description="The device-plugin deploy label before the pause (absent: \"true\").")
    device_plugin_label_absent: bool | None = Field(
        None, description="The device-plugin deploy label was absent before the pause (restored as absent).")
    started_at: float
    updated_at: float
    steps: list[_LongText] = Field(default_factory=list, max_length=64)


class MigConfigEntryWire(ApiModel):
    """One mig-parted config entry as the agent publishes it (always by GPU index)."""

    devices: list[Annotated[int, Field(ge=0, le=63)]] = Field(max_length=64)
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, Annotated[int, Field(ge=0, le=64)]] | None = Field(
        None, alias="mig-devices", max_length=64)


class ReconfigurationStatus(ApiModel):
    """The node agent's journal of a reconfiguration in progress.

    Typed in full, so that the API server bounds what an agent's token can store
    here (issue 33, item 2: an unknown-fields journal took 9,000-deep JSON and
    blinded every GPUNode watch); a restarted agent finishes or rolls back a
    half-applied plan from these fields (invariant 2).
    """

    phase: str = Field(pattern=r"^[A-Z][A-Za-z]*$", max_length=64, description="e.g. Applying")
    step: int = Field(0, ge=0, description="Index of the next plan step to run.")
    plan: list[ReconfigurationPlanStep] = Field(default_factory=list, max_length=256)
    target_generation: int | None = Field(None, ge=0)
    started_at: datetime | None = Field(None, strict=False)
    message: str | None = Field(None, max_length=4096)
    mode: Literal["direct", "operator"] | None = None
    gpu_index: int | None = Field(None, ge=0, le=63, description="Direct mode: the GPU being reshaped.")
    journal: ReconfigurationJournal | None = None
    mig_config: str | None = Field(
        None, max_length=63, description="Operator mode: the mig-parted config this reconfiguration applies.")
    mig_config_entries: list[MigConfigEntryWire] | None = Field(
        None, max_length=64,
        description="Operator mode: that config's entries (mig-parted's format), which the controller publishes "
                    "into mig-manager's ConfigMap under migConfig; only the node's own names are published.")


class NodeSummary(ApiModel):
    """Counts for ``kubectl get gpunodes``."""

    gpus: int = Field(0, ge=0)
    mig_instances: int = Field(0, ge=0)
    instances_in_use: int = Field(0, ge=0)
    unhealthy_gpus: int = Field(0, ge=0, description="GPUs with a fault (instances with one not counted).")
    unhealthy_instances: int = Field(0, ge=0, description="MIG instances with a fault on GPUs without one.")
    degraded: bool = Field(
        False, description="A fault the device plugin does not withdraw by itself: gpupack sends no new pods here.")


# ------------------------------------------------------------- published use (issue 35)


MAX_CHECKPOINT_WEIGHT = 10000
"""A histogram's largest bucket weight once written: the others are scaled to integers beside it
(the Kubernetes VPA's ``MaxCheckpointWeight``, its ``VerticalPodAutoscalerCheckpoint`` format)."""
MAX_HISTOGRAM_BUCKETS = 256
MAX_PEAK_INTERVALS = 192
"""Hourly memory peaks remembered for a day are 24; room for shorter intervals or longer windows."""
MAX_USAGE_PODS = 256
"""Pod containers one GPUNode publishes at most (``status.usage.pods``): a node's GPUs are held by
far fewer (16 GPUs x 7 MIG instances is 112); the rest are left out and counted."""


class HistogramCheckpoint(ApiModel):
    """A decaying histogram, sparse: bucket ``buckets[i]`` holds ``weights[i]`` (integers, the largest
    ``MAX_CHECKPOINT_WEIGHT``) of ``totalWeight``, decayed to ``referenceSeconds``
    (``sharing.usage.compact``)."""

    reference_seconds: float = Field(0.0, ge=0, description="Unix time the weights are decayed to.")
    total_weight: float = Field(0.0, ge=0, description="The histogram's total weight before scaling.")
    buckets: list[Annotated[int, Field(ge=0, le=MAX_HISTOGRAM_BUCKETS)]] = Field(
        default_factory=list, max_length=MAX_HISTOGRAM_BUCKETS)
    weights: list[Annotated[int, Field(ge=1, le=MAX_CHECKPOINT_WEIGHT)]] = Field(
        default_factory=list, max_length=MAX_HISTOGRAM_BUCKETS)

    @model_validator(mode="after")
    def _same_length(self) -> HistogramCheckpoint:
        if len(self.buckets) != len(self.weights):
            raise ValueError(f"buckets ({len(self.buckets)}) and weights ({len(self.weights)}) differ in length")
        if len(set(self.buckets)) != len(self.buckets):
            raise ValueError("buckets must not repeat")
        return self


class PeakCheckpoint(ApiModel):
    """Memory peaks, one per interval: interval ``intervals[i]`` (its start is ``intervals[i] x
    intervalSeconds``, Unix time) peaked at ``bytes[i]``."""

    interval_seconds: int = Field(3600, ge=1, le=86400)
    intervals: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=MAX_PEAK_INTERVALS)
    bytes: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=MAX_PEAK_INTERVALS)

    @model_validator(mode="after")
    def _same_length(self) -> PeakCheckpoint:
        if len(self.intervals) != len(self.bytes):
            raise ValueError(f"intervals ({len(self.intervals)}) and bytes ({len(self.bytes)}) differ in length")
        return self


class UsageHistory(ApiModel):
    """One container's use, compactly: what ``sharing.usage.recommender.ContainerHistory`` holds."""

    first_seconds: float = Field(0.0, ge=0, description="Unix time of the first sample.")
    last_seconds: float = Field(0.0, ge=0, description="Unix time of the last sample.")
    samples: int = Field(0, ge=0)
    duty: HistogramCheckpoint = Field(default_factory=HistogramCheckpoint, description="Duty cycle, percent.")
    memory: PeakCheckpoint = Field(default_factory=PeakCheckpoint, description="GPU memory used, bytes.")
    limit_hits: int = Field(0, ge=0, description="Times the container's GPU memory reached its limit.")
    last_hit_seconds: float | None = Field(None, ge=0, description="Unix time of the last limit hit.")
    last_hit_limit_bytes: int | None = Field(None, ge=0, description="The limit the last hit reached.")
    gpu_memory_mib: int = Field(0, ge=0, alias="gpuMemoryMiB",
                                description="The largest GPU (or MIG instance) memory the use was seen on.")
    memory_last_seconds: float | None = Field(
        None, ge=0, description="Unix time of the last memory sample, memory-only ones (an MPS client's) included.")


class PodUsage(UsageHistory):
    """One pod container's use on this node, as the agent aggregated it."""

    pod: str = Field(pattern=POD_REF_PATTERN, max_length=317, description="namespace/name")
    uid: str = Field("", max_length=64)
    container: str = Field("", max_length=63, description="Empty: several containers ask for GPUs.")
    unattributed: str = Field(
        "", max_length=1024,
        description="Why this pod's use is not known to be its own (never sized); empty when it is.")
    compute_unattributed: str = Field(
        "", max_length=1024,
        description="Why this pod's compute is not known to be its own (its duty cycle is not in the history, "
                    "its memory and limit hits are: e.g. an MPS client); empty when it is.")


class NodeUsage(ApiModel):
    """What the node's pods used of its GPUs, aggregated on the node (written every few minutes)."""

    published_time: datetime | None = Field(None, strict=False)
    pods: list[PodUsage] = Field(default_factory=list, max_length=MAX_USAGE_PODS)
    left_out: int = Field(0, ge=0, description="Pod containers not published (more than the list holds).")

    @model_validator(mode="after")
    def _unique_pods(self) -> NodeUsage:
        seen: set[tuple[str, str, str]] = set()
        for pod in self.pods:
            key = (pod.pod, pod.uid, pod.container)
            if key in seen:
                raise ValueError(f"pods: duplicate {key}")
            seen.add(key)
        return self


class GPUNodeStatus(ApiModel):
    """Observed state, written by the node agent."""

    observed_generation: int | None = Field(None, ge=0)
    product: str | None = Field(None, max_length=128)
    gpus: Annotated[
        list[GPUStatus], Field(json_schema_extra=_list_map("index"))
    ] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    sharing: SharingStatus | None = None
    summary: NodeSummary | None = None
    conditions: Annotated[
        list[Condition], Field(json_schema_extra=_list_map("type"))
    ] = Field(default_factory=list, max_length=16)
    reconfiguration: ReconfigurationStatus | None = None
    heartbeat_time: datetime | None = Field(
        None, strict=False,
        description="When the node agent last wrote this status (at least every heartbeat interval, 60 s by "
                    "default). The controller stops planning on a node whose heartbeat is older than its "
                    "agentStaleSeconds.",
    )
    usage: NodeUsage | None = Field(
        None, description="Per-pod GPU use aggregated on the node (issue 35), written every few minutes.")

    @model_validator(mode="after")
    def _unique_keys(self) -> GPUNodeStatus:
        _unique(self.gpus, "index", "gpus")
        _unique(self.conditions, "type", "conditions")
        return self


# ------------------------------------------------------------- SharingPolicy


def labels_match(match_labels: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """The one reading of an equality-based selector: every pair present (empty: everything)."""
    return all(labels.get(k) == v for k, v in match_labels.items())


class LabelSelector(ApiModel):
    """Equality-based label selector; empty selects everything."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict, max_length=32)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return labels_match(self.match_labels, labels)


class NamespaceRule(ApiModel):
    """Which sharing modes pods of some namespaces may use."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("has(self.names) != has(self.selector)", "set exactly one of names or selector"),
        )
    )
    names: list[Annotated[str, Field(max_length=63)]] | None = Field(None, max_length=256)
    selector: LabelSelector | None = None
    allowed_modes: list[Mode] = Field(min_length=1, max_length=3)

    @model_validator(mode="after")
    def _one_namespace_source(self) -> NamespaceRule:
        if (self.names is None) == (self.selector is None):
            raise ValueError("set exactly one of names or selector")
        return self

    def matches(self, namespace: str, labels: Mapping[str, str] | None) -> bool:
        """Whether the rule covers ``namespace`` (``labels``: its labels, None when unknown;
        an empty selector covers every namespace, known or not)."""
        if self.names is not None:
            return namespace in self.names
        selector = self.selector or LabelSelector()
        if not selector.match_labels:
            return True
        return labels is not None and selector.matches(labels)


class LayoutPolicy(ApiModel):
    """Pin MIG geometry (static) or let gpupack reshape within allowed profiles (dynamic)."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "self.mode == 'dynamic' ? (!has(self.migConfig) && !has(self.instances))"
                " : (has(self.migConfig) != has(self.instances))",
                "static needs exactly one of migConfig or instances; dynamic takes neither",
            ),
        )
    )
    mode: Literal["static", "dynamic"] = "dynamic"
    mig_config: str | None = Field(None, pattern=MIG_CONFIG_PATTERN)
    instances: list[MigInstanceSpec] | None = Field(None, max_length=MAX_MIG_INSTANCES)

    @model_validator(mode="after")
    def _static_needs_one_geometry(self) -> LayoutPolicy:
        has_config, has_instances = self.mig_config is not None, self.instances is not None
        ok = (has_config != has_instances) if self.mode == "static" else not (has_config or has_instances)
        if not ok:
            raise ValueError(
                "static needs exactly one of migConfig or instances; dynamic takes neither"
            )
        return self


class ReshapingWindow(ApiModel):
    """A UTC time window in which reshaping may start; end < start crosses midnight."""

    start: str = Field(pattern=HHMM_PATTERN, description="HH:MM, UTC")
    end: str = Field(pattern=HHMM_PATTERN, description="HH:MM, UTC")
    days: list[Weekday] = Field(
        default_factory=lambda: list(WEEKDAYS),
        min_length=1,
        max_length=7,
    )


class ReshapingPolicy(ApiModel):
    """When and how much gpupack may repartition GPUs of the selected nodes."""

    windows: list[ReshapingWindow] = Field(
        default_factory=list, max_length=16, description="Empty: reshaping allowed at any time."
    )
    max_concurrent: int = Field(1, ge=0, description="GPUs reshaped at once; 0 freezes layouts.")
    idle_seconds: int = Field(300, ge=0, description="Idle time of a GPU before it is reshaped.")


class ReplicaPolicy(ApiModel):
    """Bounds for the MPS/time-slicing replica count gpupack splits a node's GPUs into."""

    model_config = ConfigDict(
        json_schema_extra=_rules(("self.min <= self.max", "min must not exceed max"))
    )
    min: int = Field(1, ge=1, le=MAX_SHARING_REPLICAS)
    max: int = Field(8, ge=1, le=MAX_SHARING_REPLICAS)
    target_utilization: int = Field(
        80, ge=1, le=100,
        description="Deprecated and ignored: read only by the replica feedback loop, which was removed. Kept so "
                    "that policies which set it stay valid.",
    )
    """Kept, not removed: a SharingPolicy stored with it must still read (``extra="forbid"``), and a
    CRD schema without it would make the API server prune it from objects users wrote."""

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaPolicy:
        if self.min > self.max:
            raise ValueError("min must not exceed max")
        return self


RightSizingMode = Literal["Off", "Initial", "Recreate"]
"""How far the right-sizer acts on a workload's recommendation (issue 35), the VPA's modes:
``Off`` recommends only; ``Initial`` also sizes new pods at admission; ``Recreate`` also evicts
running pods far from their recommendation so they come back sized."""
RIGHT_SIZING_MODES: tuple[RightSizingMode, ...] = ("Off", "Initial", "Recreate")


class RightSizingPolicy(ApiModel):
    """Whether and how gpupack sizes pods of the policy's namespaces by what they use (opt-in)."""

    mode: RightSizingMode = Field("Off", description="Off (recommend only), Initial or Recreate.")
    compute_overcommit: float = Field(
        1.0, ge=1.0, le=4.0,
        description="Predicted compute a GPU may carry, in GPUs (1.0: none over-committed). Memory never is.")
    max_evictions_per_hour: int = Field(
        1, ge=0, le=60, description="Recreate: pods of one workload evicted per hour at most (0: none).")


class SharingPolicySpec(ApiModel):
    """An admin's policy for the nodes it selects."""

    node_selector: LabelSelector = Field(default_factory=LabelSelector)
    namespaces: list[NamespaceRule] = Field(
        default_factory=list, max_length=64, description="Empty: every namespace may use any mode."
    )
    allowed_profiles: list[Annotated[str, Field(pattern=MIG_PROFILE_PATTERN, max_length=32)]] | None = (
        Field(None, max_length=32, description="MIG profiles gpupack may create; absent: all.")
    )
    default_gpu_memory: str | None = Field(
        None, pattern=MEMORY_QUANTITY_PATTERN, max_length=32, description="For requests without gpu-memory."
    )
    layout: LayoutPolicy = Field(default_factory=LayoutPolicy)
    reshaping: ReshapingPolicy = Field(default_factory=ReshapingPolicy)
    replicas: ReplicaPolicy = Field(default_factory=ReplicaPolicy)
    right_sizing: RightSizingPolicy | None = Field(
        None, description="Sizing pods of the matched namespaces by their observed GPU use; absent: Off.")

    def modes_for(self, namespace: str, labels: Mapping[str, str] | None) -> tuple[Mode, ...]:
        """The sharing modes pods of ``namespace`` may use under this policy (no rules: all)."""
        if not self.namespaces:
            return MODES
        allowed = {m for rule in self.namespaces if rule.matches(namespace, labels) for m in rule.allowed_modes}
        return tuple(m for m in MODES if m in allowed)

    @property
    def default_gpu_memory_bytes(self) -> int | None:
        """``defaultGpuMemory`` in bytes (the pattern already admits only valid quantities)."""
        if self.default_gpu_memory is None:
            return None
        return int(parse_quantity(self.default_gpu_memory))


class SharingPolicyStatus(ApiModel):
    """What the controller made of the policy (written by ``controller/writes/policy_status.py``).

    Conditions: ``Ready`` (``Applied``: the controller plans with this spec;
    ``InvalidSpec``: it does not, and says why) and ``Overlapping`` (``True``
    when another policy selects some of the same nodes: there the strictest
    bound of each applies, docs/controller.md).
    """

    observed_generation: int | None = Field(None, ge=0)
    matched_nodes: int = Field(0, ge=0, description="GPU nodes (with a GPUNode) the selector matches.")
    applied_time: datetime | None = Field(
        None, strict=False, description="When the controller began planning with this generation."
    )
    conditions: Annotated[
        list[Condition], Field(json_schema_extra=_list_map("type"))
    ] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _unique_conditions(self) -> SharingPolicyStatus:
        _unique(self.conditions, "type", "conditions")
        return self


# ------------------------------------------------------------- GPURecommendation


RecommendationSource = Literal["Agents", "Prometheus"]
"""Where the recommender read the use: the node agents' histograms or a Prometheus server."""


class WorkloadTargetRef(ApiModel):
    """The workload a recommendation is for (``sharing.api.workload.WorkloadRef``, namespace implied)."""

    kind: str = Field(min_length=1, max_length=63)
    name: str = Field(min_length=1, max_length=253)


class ContainerRecommendation(ApiModel):
    """A size for one container of the workload, and the history behind it."""

    container_name: str = Field(min_length=1, max_length=63)
    gpu_milli: int = Field(ge=0, le=1000, description="Compute, thousandths of one GPU.")
    gpu_memory: str = Field(pattern=MEMORY_QUANTITY_PATTERN, max_length=32, description="GPU memory limit.")
    observed_seconds: int = Field(0, ge=0, description="The history's span: first sample to last.")
    confidence_days: float = Field(0.0, ge=0, description="Observed time in days (the VPA's measure).")
    ooms: int = Field(0, ge=0, description="Memory-limit hits seen; each raised the memory at once.")
    pods: int = Field(0, ge=0, description="Pods whose use the history holds.")

    @property
    def gpu_memory_bytes(self) -> int:
        return int(parse_quantity(self.gpu_memory))



class ContainerCheckpoint(UsageHistory):
    """The merged history of one container of the workload's pods that have gone."""

    container_name: str = Field(min_length=1, max_length=63)
    pods: int = Field(0, ge=0, description="Gone pods whose history this holds.")

class GPURecommendationSpec(ApiModel):
    """Written by the controller when it first sees the workload's use."""

    target_ref: WorkloadTargetRef


class GPURecommendationStatus(ApiModel):
    """The recommendation (written by the controller's recommender)."""

    source: RecommendationSource | None = None
    mode: RightSizingMode | None = Field(None, description="The right-sizing mode in force for the workload.")
    containers: Annotated[
        list[ContainerRecommendation], Field(json_schema_extra=_list_map("containerName"))
    ] = Field(default_factory=list, max_length=32)
    last_update_time: datetime | None = Field(None, strict=False)
    conditions: Annotated[
        list[Condition], Field(json_schema_extra=_list_map("type"))
    ] = Field(default_factory=list, max_length=16)
    checkpoint: list[ContainerCheckpoint] = Field(
        default_factory=list, max_length=32,
        description="The history of the workload's pods that have gone, per container, so a rollout "
                    "does not forget it (the live pods' history is on their nodes' GPUNodes).")

    @model_validator(mode="after")
    def _unique_keys(self) -> GPURecommendationStatus:
        _unique(self.containers, "container_name", "containers")
        _unique(self.checkpoint, "container_name", "checkpoint")
        _unique(self.conditions, "type", "conditions")
        return self


# ------------------------------------------------------------ whole resources


class ObjectMeta(BaseModel):
    """The part of ``metadata`` gpupack reads; the API server owns the rest."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)
    name: str = Field(max_length=253)


class GPUNode(ApiModel):
    """Cluster-scoped, one per Node, same name as the Node."""

    api_version: Literal["gpupack.io/v1alpha1"] = API_VERSION
    kind: Literal["GPUNode"] = "GPUNode"
    metadata: ObjectMeta
    spec: GPUNodeSpec = Field(default_factory=GPUNodeSpec)
    status: GPUNodeStatus | None = None


class SharingPolicy(ApiModel):
    """Cluster-scoped admin policy."""

    api_version: Literal["gpupack.io/v1alpha1"] = API_VERSION
    kind: Literal["SharingPolicy"] = "SharingPolicy"
    metadata: ObjectMeta
    spec: SharingPolicySpec = Field(default_factory=SharingPolicySpec)
    status: SharingPolicyStatus | None = None


class GPURecommendation(ApiModel):
    """Namespaced, one per workload, named by ``sharing.api.workload.recommendation_name``."""

    api_version: Literal["gpupack.io/v1alpha1"] = API_VERSION
    kind: Literal["GPURecommendation"] = "GPURecommendation"
    metadata: ObjectMeta
    spec: GPURecommendationSpec
    status: GPURecommendationStatus | None = None


# ------------------------------------------------------------ one reader


@dataclass(frozen=True)
class PolicyEntry:
    """One ``SharingPolicy`` object as every component reads it."""

    name: str
    generation: int
    spec: SharingPolicySpec | None
    """None when the spec does not validate: then no component applies it."""
    problem: str | None = None
    """Why the spec does not validate (its first error, located)."""


def read_policies(objects: Iterable[Mapping[str, Any]]) -> list[PolicyEntry]:
    """The ``SharingPolicy`` objects, by name: the one reading the webhook, the controller and
    the node agent share. An object without a name is left out; one whose spec does not
    validate is returned without a spec, with the reason, for the caller to log and count."""
    out = []
    for obj in objects:
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str):
            continue
        raw_generation = meta.get("generation") if isinstance(meta, Mapping) else None
        generation = raw_generation if isinstance(raw_generation, int) and not isinstance(raw_generation, bool) else 0
        try:
            out.append(PolicyEntry(name, generation, SharingPolicySpec.model_validate(obj.get("spec") or {})))
        except ValidationError as exc:
            out.append(PolicyEntry(name, generation, None, _first_error(exc)))
    return sorted(out, key=lambda p: p.name)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"spec.{where}: {error.get('msg', 'invalid')}" if where else f"spec: {error.get('msg', 'invalid')}"
