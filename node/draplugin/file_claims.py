"""``FileClaimSource``: ResourceClaims read from a file, for nodes without an API server (simulation, tests).

The file holds ResourceClaim objects as the API returns them, in JSON or YAML:
one object, a list, or a ``kind: List`` with ``items``. It is read again at
every lookup, so a test or a demo can add claims while the plugin runs (write
it atomically: the plugin may read at any moment).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kube.inputfile import read_text
from node.draplugin.claims import ClaimError, ClaimRef, allocation_from_claim
from sharing.dra.results import AllocatedDevice


class FileClaimSource:
    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        for obj in self._objects():
            meta = obj.get("metadata")
            if isinstance(meta, Mapping) and meta.get("namespace") == claim.namespace and meta.get("name") == claim.name:
                return allocation_from_claim(obj, claim)
        raise ClaimError(f"{claim} does not exist (not in {self.path})")

    def _objects(self) -> list[Mapping[str, Any]]:
        try:
            doc = yaml.safe_load(read_text(self.path, syntax="yaml"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ClaimError(f"cannot read the claims file {self.path}: {exc}") from None
        if isinstance(doc, Mapping) and isinstance(doc.get("items"), list):
            doc = doc["items"]
        items = doc if isinstance(doc, list) else [doc] if doc is not None else []
        return [item for item in items if isinstance(item, Mapping)]
