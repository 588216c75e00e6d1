"""Checks on a SharingPolicy beyond its schema: what only gpupack's catalog knows.

The CRD's OpenAPI schema and CEL rules (generated from ``sharing.api.crd``) already
reject most malformed policies at the API server; the validating webhook runs
the same pydantic model (so a policy created where the CRD is older still gets
the same messages) and adds what a schema cannot say: that every MIG profile
named exists on some GPU model gpupack knows, that the default GPU memory fits
some GPU, and that a named mig-parted config is one of NVIDIA's defaults (a
warning only: a site may ship its own configs).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from mig.catalog import all_models
from mig.migparted import builtin_config_names
from sharing.api.crd import SharingPolicy
from sharing.api.request import AdmissionRefusal, parse_quantity

_MAX_ERRORS = 8


def _known_profiles() -> set[str]:
    return {p.name for m in all_models() for p in m.profiles}


def policy_problems(obj: Any) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` for a SharingPolicy object; no problems = valid."""
    if not isinstance(obj, dict):
        return ["request.object is not a SharingPolicy object"], []
    try:
        policy = SharingPolicy.model_validate(obj)
    except ValidationError as exc:
        errors = []
        for error in exc.errors()[:_MAX_ERRORS]:
            where = ".".join(str(part) for part in error["loc"]) or "(root)"
            errors.append(f"{where}: {error['msg']}")
        if exc.error_count() > _MAX_ERRORS:
            errors.append(f"... and {exc.error_count() - _MAX_ERRORS} more")
        return errors, []
    problems: list[str] = []
    warnings: list[str] = []
    known = _known_profiles()
    spec = policy.spec
    for name in spec.allowed_profiles or []:
        if name not in known:
            problems.append(
                f"spec.allowedProfiles: {name!r} is not a MIG profile of any known GPU model; "
                f"known profiles: {', '.join(sorted(known))}"
            )
    for i, instance in enumerate(spec.layout.instances or []):
        if instance.profile not in known:
            problems.append(f"spec.layout.instances[{i}].profile: {instance.profile!r} is not a known MIG profile")
        elif spec.allowed_profiles is not None and instance.profile not in spec.allowed_profiles:
            problems.append(
                f"spec.layout.instances[{i}].profile: {instance.profile!r} is not in spec.allowedProfiles"
            )
    if spec.layout.mig_config and spec.layout.mig_config not in builtin_config_names():
        warnings.append(
            f"spec.layout.migConfig {spec.layout.mig_config!r} is not one of NVIDIA's default mig-parted "
            f"configs; make sure the GPU Operator's mig-parted ConfigMap defines it"
        )
    if spec.default_gpu_memory is not None:
        largest = max(m.memory_mib for m in all_models()) * 1024 * 1024
        try:
            memory = parse_quantity(spec.default_gpu_memory, what="spec.defaultGpuMemory")
        except AdmissionRefusal as refusal:
            problems.append(refusal.message)
        else:
            if memory > largest:
                problems.append(
                    f"spec.defaultGpuMemory {spec.default_gpu_memory} is larger than any known GPU "
                    f"({largest // 1024**3} GiB)"
                )
    for i, rule in enumerate(spec.namespaces):
        if len(set(rule.allowed_modes)) != len(rule.allowed_modes):
            problems.append(f"spec.namespaces[{i}].allowedModes lists a mode twice")
    return problems, warnings
