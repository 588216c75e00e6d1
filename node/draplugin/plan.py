"""From a claim's allocation to what preparing it means, device by device; nothing is changed here.

Each of the claim's gpupack devices (other drivers' results are theirs) is
checked against this node and what NVML reports, and becomes a
:class:`~node.draplugin.journal.DeviceRecord` with its plan: the MIG profile
and placement to create, or the share's MPS limits. Every refusal names the
device and the rule:

* a device from another node's pool, a name gpupack never publishes, a GPU
  index the node does not have;
* a MIG device on a GPU whose MIG mode is off, a profile the GPU does not
  offer, a placement the profile does not allow (stale ResourceSlices);
* a shared GPU in MIG mode: gpupack's plugin does not switch MIG mode (that
  needs an idle GPU and a reset); the agent publishes shared devices only for
  GPUs with MIG off. A **whole GPU in MIG mode** (offered with
  ``DRA_WHOLE_GPU``, only while no instance is on it) is served by the GPU's
  full-size instance (every compute and memory slice: ``7g.80gb`` on an H100),
  created at prepare and destroyed at unprepare like any MIG device, so MIG mode
  never changes and no reset is needed;
* an MPS share whose allocation records no consumed capacity (a right-sized one, which its claim's
  configuration names, gets no SM cap: ``node.draplugin.mps``);
* admin access (monitoring a device others use), which gpupack does not offer;
* the same MIG instance or whole GPU twice in one claim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from node.draplugin.claims import ClaimError
from sharing.dra.results import AllocatedDevice
from sharing.dra.names import DeviceNameError, parse_device_name, resolve_profile
from node.draplugin.journal import DeviceRecord
from node.draplugin.mps import mps_limits
from node.draplugin.settings import ShareMode
from node.nvml.errors import NvmlError
from node.nvml.protocol import NvmlReader
from node.base.snapshot import model_from_nvml
from sharing.dra.names import DRIVER
from sharing.packing.mig_layouts import full_profile

T = TypeVar("T")


def nvml_call(what: str, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` with an NVML failure turned into a :class:`ClaimError` that says what was being done."""
    try:
        return fn(*args)
    except NvmlError as exc:
        raise ClaimError(f"NVML failed {what}: {exc}") from None


def plan_claim(results: Sequence[AllocatedDevice], nvml: NvmlReader, *, node: str,
               share_mode: ShareMode) -> tuple[DeviceRecord, ...]:
    """The plan for the claim's gpupack devices, in allocation order; raises :class:`ClaimError`
    naming every device that cannot be prepared."""
    ours = [r for r in results if r.driver == DRIVER]
    if not ours:
        drivers = sorted({r.driver for r in results})
        raise ClaimError(f"the claim has no device of driver {DRIVER} (its allocation names "
                         f"{', '.join(drivers) if drivers else 'no device at all'}); nothing for this plugin to prepare")
    count = nvml_call("counting GPUs", nvml.device_count)
    planned: list[DeviceRecord] = []
    problems: list[str] = []
    for result in ours:
        try:
            planned.append(plan_device(result, nvml, node=node, share_mode=share_mode, gpu_count=count))
        except ClaimError as exc:
            problems.append(str(exc))
    seen: dict[tuple[int, str], str] = {}
    for device in planned:
        if device.kind == "shared":
            continue  # one shared GPU may serve several requests of a claim
        key = (device.gpu, "gpu" if device.kind == "gpu" else str(device.placement))
        if key in seen:
            problems.append(f"device {device.device} (request {device.request}) is allocated twice in one claim "
                            f"(also to request {seen[key]})")
        seen[key] = device.request
    if problems:
        raise ClaimError("; ".join(problems))
    return tuple(planned)


def plan_device(result: AllocatedDevice, nvml: NvmlReader, *, node: str, share_mode: ShareMode,
                gpu_count: int) -> DeviceRecord:
    where = f"device {result.device} (request {result.request})"
    if result.pool != node:
        raise ClaimError(f"{where} is allocated from pool {result.pool!r}, but this plugin serves node {node!r} "
                         "(gpupack's pool of a node is named after it)")
    if result.admin_access:
        raise ClaimError(f"{where} is allocated with admin access, which gpupack's driver does not offer")
    try:
        name = parse_device_name(result.device)
    except DeviceNameError as exc:
        raise ClaimError(str(exc)) from None
    if name.gpu >= gpu_count:
        raise ClaimError(f"{where}: this node has {gpu_count} GPU(s), no GPU {name.gpu}")
    info = nvml_call(f"reading GPU {name.gpu}", nvml.device_info, name.gpu)
    base = DeviceRecord(request=result.request, pool=result.pool, device=result.device, kind=name.kind,
                        gpu=name.gpu, gpu_uuid=info.uuid, share_id=result.share_id)
    if name.kind == "mig":
        if not info.mig_enabled or info.mig_pending != info.mig_enabled:
            raise ClaimError(f"{where}: GPU {name.gpu} is not in MIG mode (current {info.mig_enabled}, pending "
                             f"{info.mig_pending}); the published MIG devices are stale")
        profiles = nvml_call(f"reading the MIG profiles of GPU {name.gpu}", nvml.instance_profiles, name.gpu)
        assert name.profile_label is not None and name.start is not None
        profile_name = resolve_profile(name.profile_label, (p.name for p in profiles))
        profile = next((p for p in profiles if p.name == profile_name), None)
        if profile is None:
            raise ClaimError(f"{where}: GPU {name.gpu} ({info.name}) has no MIG profile spelled "
                             f"{name.profile_label!r}; it has {', '.join(p.name for p in profiles)}")
        placement = next((p for p in profile.placements if p.start == name.start), None)
        if placement is None:
            raise ClaimError(f"{where}: profile {profile.name} cannot start at memory slice {name.start} on "
                             f"{info.name}; its placements start at "
                             f"{', '.join(str(p.start) for p in profile.placements)}")
        return replace(base, profile=profile.name, profile_id=profile.profile_id, placement=placement)
    if name.kind == "gpu" and info.mig_enabled and info.mig_pending:
        profiles = nvml_call(f"reading the MIG profiles of GPU {name.gpu}", nvml.instance_profiles, name.gpu)
        if not profiles:
            raise ClaimError(f"{where}: GPU {name.gpu} ({info.name}) is in MIG mode and reports no MIG profile")
        full = full_profile(model_from_nvml(info, profiles))  # NVML's own table: its profile ids
        placement = max(full.placements, key=lambda p: p.size)
        return replace(base, profile=full.name, profile_id=full.profile_id, placement=placement)
    if info.mig_enabled or info.mig_pending:
        if name.kind == "gpu":
            raise ClaimError(f"{where}: GPU {name.gpu} is changing MIG mode (current {info.mig_enabled}, pending "
                             f"{info.mig_pending}: it waits for a reset); it can be given whole neither way until then")
        raise ClaimError(f"{where}: GPU {name.gpu} is in MIG mode, and a shared GPU needs MIG mode off; gpupack's "
                         "plugin does not switch MIG mode (that needs an idle GPU and a reset)")
    if name.kind == "shared" and share_mode == "mps":
        try:
            limits = mps_limits(result.consumed, result.device, right_sized=result.predicted_milli is not None)
        except ValueError as exc:
            raise ClaimError(str(exc)) from None
        return replace(base, mps=limits)
    return base
