"""Objects nested to break readers (issue 33, item 2), on the real control plane.

The agent's own pod-bound token patches its own GPUNode status with JSON nested
1,500 deep: the typed schema leaves nothing of it stored. An admin stores a
ResourceClaim whose opaque parameters nest 3,000 deep (the API server keeps any
JSON there): the informer every gpupack reader uses keeps the other claims and
keeps following changes, leaving out that one claim.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
from kubernetes import client

from controller.kube import Kube as ControllerKube
from gpupack.devcluster.controlplane import ControlPlane
from kube.errors import KubeError
from kube.informer import Informer
from node.draplugin.claims import ClaimError, ClaimRef
from node.draplugin.kube_claims import KubeClaimSource
from tests.e2e.test_agent_rbac import POLICY, _agent_on, _new_node, _test_agent

DEEP = 1_500


def _send_raw(api: Any, method: str, path: str, text: str, content_type: str) -> Any:
    """Send JSON text the client's own encoder could not write (it recurses), with the client's credentials."""
    cfg = api.configuration
    headers = {"Content-Type": content_type, "Accept": "application/json"}
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    if token:
        prefix = cfg.api_key_prefix.get("authorization") or cfg.api_key_prefix.get("BearerToken") or ""
        headers["Authorization"] = f"{prefix} {token}".strip() if not token.startswith("Bearer") else token
    return api.rest_client.pool_manager.request(method, cfg.host + path, body=text.encode(), headers=headers)


def test_agent_token_cannot_store_deep_json_in_its_own_gpunode_status(
    control_plane: ControlPlane, admin_client: Any, gpupack_installed: list[dict[str, Any]],
    apply_manifests: Callable[..., list[dict[str, Any]]], tmp_path: Path,
) -> None:
    core = client.CoreV1Api(admin_client)
    sa = _test_agent(admin_client, apply_manifests, "agent-deep", POLICY)
    own = _new_node(core)
    kube = _agent_on(control_plane, core, sa, own, tmp_path)
    deadline = time.monotonic() + 30
    while True:  # the policy cache may not have the test's binding yet: retry until allowed
        try:
            kube.create_gpunode(own, None)
            break
        except KubeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    api = kube._custom.api_client  # noqa: SLF001 - the agent's own client and token
    nested = '{"a":' * DEEP + "1" + "}" * DEEP
    for where in ('"x":' + nested, '"plan":[{"op":"create","deep":' + nested + "}]"):
        body = '{"status":{"reconfiguration":{"phase":"Applying",' + where + "}}}"
        answer = _send_raw(api, "PATCH", f"/apis/gpupack.io/v1alpha1/gpunodes/{own}/status", body,
                           "application/merge-patch+json")
        assert answer.status in (200, 422), answer.data[:300]
        stored = client.CustomObjectsApi(admin_client).get_cluster_custom_object(
            "gpupack.io", "v1alpha1", "gpunodes", own)
        text = json.dumps(stored)
        assert '{"a": {"a":' not in text, "the API server stored the agent's deep JSON"


def test_informer_keeps_other_claims_and_its_watch_when_one_claim_is_deep(
    admin_client: Any, namespace: str,
) -> None:
    def claim(name: str, parameters: str) -> str:
        return ('{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"' + name + '"},'
                '"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpupack-shared"}}],'
                '"config":[{"requests":["gpu"],"opaque":{"driver":"other.example.com","parameters":'
                + parameters + "}}]}}}")

    api = admin_client
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    for name, parameters in (("good", '{"a":1}'), ("deep", '{"a":' + "[" * 3_000 + "]" * 3_000 + "}")):
        answer = _send_raw(api, "POST", path, claim(name, parameters), "application/json")
        assert answer.status == 201, answer.data[:300]
    # The direct readers: the controller's list before its cache has listed, the DRA plugin's get.
    listed = [f"{c['metadata']['namespace']}/{c['metadata']['name']}"
              for c in ControllerKube(admin_client).list_resource_claims()]
    assert f"{namespace}/good" in listed and f"{namespace}/deep" not in listed
    with pytest.raises(ClaimError):  # not RecursionError out of the client (the plugin reads by name)
        KubeClaimSource(admin_client).get(ClaimRef(uid="any", namespace=namespace, name="deep"))
    resource = client.ResourceV1Api(admin_client)
    informer = Informer("resourceclaims", functools.partial(resource.list_namespaced_resource_claim, namespace),
                        watch_seconds=5, max_backoff_s=1)
    informer.start()
    try:
        assert informer.wait_synced(30)
        assert [o["metadata"]["name"] for o in informer.items()] == ["good"]
        assert list(informer.rejected) == [f"{namespace}/deep"]
        # the watch goes on: a change of the good claim arrives although the deep one is listed too
        version = informer.version
        resource.patch_namespaced_resource_claim("good", namespace, {"metadata": {"labels": {"seen": "yes"}}})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            informer.wait_changed(version, 1)
            good = informer.get(f"{namespace}/good")
            if good is not None and (good["metadata"].get("labels") or {}).get("seen") == "yes":
                break
        else:
            pytest.fail("the informer stopped following claims after a deep one")
        assert informer.lists == 1, "the watch failed and listed again"
    finally:
        informer.stop()
