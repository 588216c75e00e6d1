"""kube.informer against the real API server: a list read in pages (limit and continue) is one
consistent list, and the watch that follows starts from its snapshot."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from kubernetes import client

from kube.informer import Informer, object_key


def test_a_paged_list_then_its_watch_see_every_object(admin_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(admin_client)
    for i in range(7):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}})
    informer = Informer("configmaps", partial(core.list_namespaced_config_map, namespace), page_size=3,
                        watch_seconds=5)
    informer.start()
    try:
        assert informer.wait_synced(30)
        names = {object_key(o).split("/", 1)[1] for o in informer.items()}
        assert {f"cm-{i}" for i in range(7)} <= names  # and the namespace's own root CA ConfigMap
        assert informer.list_requests == -(-len(names) // 3) >= 3
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "after"}})
        core.delete_namespaced_config_map("cm-0", namespace)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (informer.get(f"{namespace}/after") is None
                                               or informer.get(f"{namespace}/cm-0") is not None):
            time.sleep(0.1)
        assert informer.get(f"{namespace}/after") is not None
        assert informer.get(f"{namespace}/cm-0") is None
        assert informer.lists == 1  # the watch went on from the paged list's version: no relist
    finally:
        informer.stop()
