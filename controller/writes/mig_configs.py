"""mig-manager's ConfigMap, written by the controller alone (GPU Operator mode).

mig-manager reads one mig-parted config for the whole cluster and applies, on
each node, the entry its ``nvidia.com/mig.config`` label names. A node agent
that wrote that ConfigMap itself could change any node's entry, and mig-manager
would destroy and recreate every instance of the GPUs it changes. So an agent
only *asks*: it puts the entries it wants in its GPUNode's status (which only
that node's agent may write: ``manifests/agent/node-restriction-policy.yaml``),
and the controller copies each request into the ConfigMap under the requesting
node's own name (``sharing.api.keys.mig_config_name``), pruning that node's older
configs. Other nodes' configs and the admin's own entries are kept as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from mig.migparted import MigConfigEntry, MigPartedConfig, dump_config, parse_config
from sharing.api.gpunode import MigConfigRequest
from sharing.api.keys import is_mig_config_of


def published_config(existing: str | None, requests: Sequence[tuple[str, MigConfigRequest]]) -> str | None:
    """``existing`` (the ConfigMap's ``config.yaml``) with each ``(node, request)`` published, or
    None when it already holds them all. Raises ``MigConfigError`` when ``existing`` is not a
    mig-parted config (an admin's file the controller must not overwrite)."""
    configs: dict[str, tuple[MigConfigEntry, ...]] = dict(parse_config(existing).mig_configs) if existing else {}
    changed = False
    for node, request in requests:
        if not is_mig_config_of(node, request.name):
            raise ValueError(f"{request.name!r} is not a config name of node {node!r}")
        for name in [n for n in configs if n != request.name and is_mig_config_of(node, n)]:
            del configs[name]
            changed = True
        if configs.get(request.name) != request.entries:
            configs[request.name] = request.entries
            changed = True
    if not changed:
        return None
    return dump_config(MigPartedConfig.model_validate({"version": "v1", "mig-configs": configs}))
