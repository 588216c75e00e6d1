"""A connection flood from one address does not block the real API server's admission calls.

One client holding the webhook's whole connection cap with silent TLS connections
used to make every call answer 503; with ``failurePolicy: Fail`` the API server
then refused every GPU pod. Here the webhook runs with small caps (20 in all, 5
per source, so a few connections reach them), registered with the real
kube-apiserver, which calls it from 127.0.0.1; the flood comes from 127.0.0.2
(all of 127.0.0.0/8 is loopback on Linux), and a pod created through the API
server must still be admitted and mutated.
"""

from __future__ import annotations

import os
import socket
import ssl
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.e2e.test_webhook_e2e import Webhook, _wait, labelled_mutating_config, registered
from gpupack.testing.admission_reviews import gpu_container, make_pod

SELECT_LABEL = "gpupack-e2e-flood"
FLOOD_SOURCE = "127.0.0.2"
CAPS = {"GPUPACK_WEBHOOK_MAX_CONNECTIONS": "20", "GPUPACK_WEBHOOK_MAX_CONNECTIONS_PER_SOURCE": "5",
        # long enough that the flood's silent connections stay open for the whole test
        "GPUPACK_WEBHOOK_REQUEST_READ_SECONDS": "120"}


@pytest.fixture(scope="module")
def capped_webhook(admin_client: Any, gpupack_installed: Any, sa_kubeconfig: Callable[[str], Path],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    saved = {name: os.environ.get(name) for name in CAPS}
    os.environ.update(CAPS)  # Webhook starts the server with this process's environment
    try:
        hook = Webhook(tmp_path_factory.mktemp("webhook-flood"), sa_kubeconfig("gpupack-webhook"))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    mutating = labelled_mutating_config(hook, f"gpupack-flood-{uuid.uuid4().hex[:6]}", SELECT_LABEL)
    try:
        _wait("webhook ready", lambda: hook.get("/readyz")[0] == 200)
        with registered(admin_client, mutating):
            yield hook
    finally:
        hook.stop()
        print(hook.log_path.read_text()[-3000:])


def _answered(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Whether the webhook decided a GPU pod's create (dry run): mutated it, or denied it itself (with no
    GPUNode in its view for this request). A failed call ("failed calling webhook") raises."""
    pod = make_pod(gpu_container("c", "100"), name=name, namespace=namespace)
    try:
        created = core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as exc:
        body = exc.body or ""
        if exc.status == 403 and "pods.gpupack.io" in body and "denied the request" in body:
            return True
        raise
    return "gpupack.io/allocation" in (created.metadata.annotations or {})


def test_the_api_server_is_admitted_while_one_source_floods_the_webhook(
        capped_webhook: Webhook, admin_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(admin_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {SELECT_LABEL: "on"}}})
    _wait("the API server to call the webhook", lambda: _answered(core, namespace, "probe"))
    ctx = ssl.create_default_context(cafile=str(capped_webhook.ca_file))
    flood = []
    try:
        for _ in range(25):  # more than the whole cap of 20
            raw = socket.create_connection(("127.0.0.1", capped_webhook.port), timeout=30,
                                           source_address=(FLOOD_SOURCE, 0))
            flood.append(ctx.wrap_socket(raw, server_hostname="localhost"))
        # Before the per-source cap: "failed calling webhook ... 503", and failurePolicy Fail refused the pod.
        for attempt in range(3):  # three admissions in a row, each through the real API server
            assert _answered(core, namespace, f"during-flood-{attempt}")
    finally:
        for tls in flood:
            tls.close()
