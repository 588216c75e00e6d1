"""Write kubeconfig files: the admin's (client certificate) and ServiceAccounts' (token).

The files are self-contained (certificates embedded as base64), so they can
be copied or handed to a subprocess without the control plane's work dir.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def kubeconfig_dict(
    server: str,
    ca_pem: bytes,
    user: str,
    *,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    token: str | None = None,
    cluster: str = "gpupack-dev",
    namespace: str | None = None,
) -> dict[str, Any]:
    """A one-cluster, one-user kubeconfig; exactly one of cert+key or token."""
    if (token is None) == (client_cert_pem is None or client_key_pem is None):
        raise ValueError("give either a client certificate and key, or a token")
    credentials: dict[str, str]
    if token is not None:
        credentials = {"token": token}
    else:
        assert client_cert_pem is not None and client_key_pem is not None
        credentials = {
            "client-certificate-data": _b64(client_cert_pem),
            "client-key-data": _b64(client_key_pem),
        }
    context: dict[str, str] = {"cluster": cluster, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster,
             "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": f"{user}@{cluster}", "context": context}],
        "current-context": f"{user}@{cluster}",
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` to ``path`` readable by the owner only (it holds credentials)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path
