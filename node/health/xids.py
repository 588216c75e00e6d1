"""What an XID means for a GPU: the classification table, and an admin's overrides of it.

An XID is the driver's error code for a GPU fault. Some are the application's
fault and leave the GPU healthy; others make the GPU (or, in MIG mode, the one
instance NVML names) unhealthy until a reset, a reboot, or an admin says so.

Sources (facts, not code):

* NVIDIA, "XID Errors" (https://docs.nvidia.com/deploy/xid-errors/): what each
  code means and the recovery its "resolution" column asks for.
* NVIDIA's device plugin (k8s-device-plugin, ``internal/rm/health.go``): XIDs 13,
  31, 43, 45, 68 and 109 are application errors that leave the device healthy;
  every other critical XID marks the device unhealthy. gpupack classifies the same
  six as application errors and treats an XID missing from its table the way the
  plugin does (unhealthy), saying so in the fault's reason (``UnknownXid``).

Admins extend or override the table in one place, the ConfigMap
``gpupack-xid-table`` (key ``xids.yaml``) in gpupack's namespace, which every
node agent reads; :func:`parse_overrides` checks it and names the entry that is
wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import yaml

from kube.inputfile import nesting_problem
from sharing.api.crd import HealthRecovery

XidAction = Literal["application", "unhealthy"]
"""``application``: the application's fault, the GPU stays healthy; ``unhealthy``: the
device gets no new work until its recovery has happened."""

XID_TABLE_CONFIGMAP = "gpupack-xid-table"
XID_TABLE_KEY = "xids.yaml"
MAX_XID = 65535
RECOVERIES: tuple[str, ...] = get_args(HealthRecovery)
ACTIONS: tuple[str, ...] = get_args(XidAction)


@dataclass(frozen=True)
class XidRule:
    xid: int
    action: XidAction
    recovery: HealthRecovery
    """What ends the fault (unused for ``application``)."""
    description: str
    known: bool = True
    """False for an XID the table does not list (treated as unhealthy, and reported as unknown)."""

    @property
    def healthy(self) -> bool:
        return self.action == "application"


def _app(xid: int, description: str) -> XidRule:
    return XidRule(xid, "application", "ResetGpu", description)


def _bad(xid: int, recovery: HealthRecovery, description: str) -> XidRule:
    return XidRule(xid, "unhealthy", recovery, description)


BUILTIN: Mapping[int, XidRule] = {rule.xid: rule for rule in (
    # The application's fault: the GPU stays healthy (as the device plugin treats them).
    _app(13, "graphics engine exception (the application's fault)"),
    _app(31, "GPU memory page fault (the application's fault)"),
    _app(43, "GPU stopped processing (the application's fault)"),
    _app(45, "preemptive cleanup after earlier errors"),
    _app(68, "video processor exception (the application's fault)"),
    _app(109, "context switch timeout"),
    # The GPU (or the MIG instance NVML names) is unhealthy until it is reset.
    _bad(38, "ResetGpu", "driver firmware error"),
    _bad(48, "ResetGpu", "double-bit ECC error"),
    _bad(61, "ResetGpu", "internal micro-controller breakpoint or warning"),
    _bad(62, "ResetGpu", "internal micro-controller halt"),
    _bad(63, "ResetGpu", "ECC page retirement or row remapping recorded; takes effect at the next reset"),
    _bad(64, "ResetGpu", "ECC page retirement or row remapping recording failed"),
    _bad(74, "ResetGpu", "NVLink error"),
    _bad(92, "ResetGpu", "high single-bit ECC error rate"),
    _bad(94, "ResetGpu", "contained ECC error"),
    _bad(95, "ResetGpu", "uncontained ECC error"),
    _bad(119, "ResetGpu", "GSP RPC timeout"),
    _bad(120, "ResetGpu", "GSP error"),
    _bad(140, "ResetGpu", "unrecovered ECC error"),
    # The GPU is gone from the bus: only a reboot brings it back.
    _bad(79, "RebootNode", "GPU has fallen off the bus"),
)}


class XidTableError(ValueError):
    """The admin's override table is malformed; the message names the entry."""


def classify(xid: int, table: Mapping[int, XidRule]) -> XidRule:
    """The rule for ``xid``: the table's, or unhealthy-until-reset for an XID it does not list."""
    rule = table.get(xid)
    if rule is not None:
        return rule
    return XidRule(xid, "unhealthy", "ResetGpu",
                   f"XID {xid} is not in gpupack's table; treated as fatal, as NVIDIA's device plugin treats "
                   f"unlisted XIDs (list it in the {XID_TABLE_CONFIGMAP} ConfigMap to change that)", known=False)


def parse_overrides(text: str) -> dict[int, XidRule]:
    """The rules of an override table (YAML: a list of ``{xid, action, recovery, description}``)."""
    if problem := nesting_problem(text, "yaml"):  # PyYAML's composer recurses once per level
        raise XidTableError(f"{XID_TABLE_KEY}: {problem}")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise XidTableError(f"{XID_TABLE_KEY} is not YAML: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, list):
        raise XidTableError(f"{XID_TABLE_KEY} must be a list of entries like "
                            "{xid: 79, action: unhealthy, recovery: RebootNode}; got a " + type(doc).__name__)
    rules: dict[int, XidRule] = {}
    for position, entry in enumerate(doc):
        rule = _entry(position, entry)
        if rule.xid in rules:
            raise XidTableError(f"entry {position} (xid {rule.xid}): xid {rule.xid} is listed twice")
        rules[rule.xid] = rule
    return rules


def _entry(position: int, entry: Any) -> XidRule:
    where = f"entry {position}"
    if not isinstance(entry, dict):
        raise XidTableError(f"{where}: must be a mapping with xid and action, got {entry!r}")
    unknown = sorted(set(map(str, entry)) - {"xid", "action", "recovery", "description"})
    if unknown:
        raise XidTableError(f"{where}: unknown field(s) {', '.join(unknown)}; known: xid, action, recovery, description")
    xid = entry.get("xid")
    if not isinstance(xid, int) or isinstance(xid, bool) or not 0 < xid <= MAX_XID:
        raise XidTableError(f"{where}: xid must be an integer from 1 to {MAX_XID}, got {xid!r}")
    where = f"entry {position} (xid {xid})"
    action = entry.get("action")
    if action not in ACTIONS:
        raise XidTableError(f"{where}: action must be one of {', '.join(ACTIONS)}, got {action!r}")
    recovery = entry.get("recovery", "ResetGpu")
    if recovery not in RECOVERIES:
        raise XidTableError(f"{where}: recovery must be one of {', '.join(RECOVERIES)}, got {recovery!r}")
    description = entry.get("description", "set by the cluster's XID table")
    if not isinstance(description, str) or len(description) > 200:
        raise XidTableError(f"{where}: description must be text of at most 200 characters")
    return XidRule(xid, action, recovery, description)


def merged(overrides: Mapping[int, XidRule]) -> dict[int, XidRule]:
    """The built-in table with the admin's entries on top."""
    return {**BUILTIN, **overrides}
