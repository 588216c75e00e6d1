"""kube.own_writes: a component reads its own writes until its informer shows them, and never longer."""

from __future__ import annotations

from typing import Any

from kube.informer import Informer
from kube.own_writes import ABSENT, WrittenObjects, version_of
from tests.unit.test_controller_caches import lister


def obj(name: str, rv: str, namespace: str | None = "ns", **rest: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, **rest}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def informer_of(*items: dict[str, Any]) -> Informer:
    informer = Informer("pods", lister(*items))
    informer.relist()
    return informer


def names_and_versions(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in items]


def test_versions_are_read_as_the_api_writes_them() -> None:
    assert version_of(obj("p", "7")) == "7"
    assert version_of(None) == ABSENT
    assert version_of({"metadata": "garbage"}) == ""
    assert version_of({}) == ""


def test_a_write_is_read_until_the_cache_shows_it() -> None:
    cache = informer_of(obj("p", "1"), obj("q", "1"))
    written = WrittenObjects()
    written.wrote("pods", cache.get("ns/p"), obj("p", "2", spec={"pinned": True}))
    assert names_and_versions(written.overlay("pods", cache, cache.items())) == [("p", "2"), ("q", "1")]
    cache.apply({"type": "MODIFIED", "object": obj("p", "2", spec={"pinned": True})})
    assert names_and_versions(written.overlay("pods", cache, cache.items())) == [("p", "2"), ("q", "1")]
    assert len(written) == 0  # caught up: forgotten


def test_two_writes_in_a_row_are_read_past_an_intermediate_cache() -> None:
    cache = informer_of(obj("p", "1"))
    written = WrittenObjects()
    written.wrote("pods", cache.get("ns/p"), obj("p", "2"))  # pin
    written.wrote("pods", cache.get("ns/p"), obj("p", "3"))  # ungate
    cache.apply({"type": "MODIFIED", "object": obj("p", "2")})  # the watch brought the pin only
    assert names_and_versions(written.overlay("pods", cache, cache.items())) == [("p", "3")]


def test_someone_elses_later_write_or_a_deletion_ends_the_written_copy() -> None:
    cache = informer_of(obj("p", "1"), obj("q", "1"))
    written = WrittenObjects()
    written.wrote("pods", cache.get("ns/p"), obj("p", "2"))
    written.wrote("pods", cache.get("ns/q"), obj("q", "2"))
    cache.apply({"type": "MODIFIED", "object": obj("p", "9")})  # the kubelet, after our write
    cache.apply({"type": "DELETED", "object": obj("q", "1")})
    assert names_and_versions(written.overlay("pods", cache, cache.items())) == [("p", "9")]
    assert len(written) == 0


def test_a_written_copy_expires() -> None:
    cache = informer_of(obj("p", "1"))
    clock = Clock()
    written = WrittenObjects(ttl_s=60, clock=clock)
    written.wrote("pods", cache.get("ns/p"), obj("p", "2"))
    clock.now = 61
    assert names_and_versions(written.overlay("pods", cache, cache.items())) == [("p", "1")]


def test_a_created_object_is_read_until_the_cache_holds_it_and_not_after_its_deletion() -> None:
    cache = Informer("gpunodes", lister())
    cache.relist()
    written = WrittenObjects()
    written.follow("gpunodes", cache)
    created = obj("n1", "5", namespace=None)
    written.wrote("gpunodes", cache.get("n1"), created)
    assert written.newest("gpunodes", "n1", cache.get("n1")) == created  # the cache has none yet
    cache.apply({"type": "ADDED", "object": obj("n1", "5", namespace=None)})
    cache.apply({"type": "DELETED", "object": obj("n1", "6", namespace=None)})
    assert written.newest("gpunodes", "n1", cache.get("n1")) is None  # gone: not brought back


def test_the_watch_forgets_a_copy_without_waiting_for_a_read() -> None:
    cache = informer_of(obj("p", "1"), obj("q", "1"))
    written = WrittenObjects()
    written.follow("pods", cache)
    written.wrote("pods", cache.get("ns/p"), obj("p", "2"))
    written.wrote("pods", cache.get("ns/q"), obj("q", "2"))
    cache.apply({"type": "MODIFIED", "object": obj("q", "1", spec={"same": "version"})})  # still older
    assert len(written) == 2
    cache.apply({"type": "MODIFIED", "object": obj("p", "2")})
    cache.apply({"type": "DELETED", "object": obj("q", "1")})
    assert len(written) == 0


def test_kinds_are_kept_apart_and_an_answer_without_a_version_is_not_kept() -> None:
    pods, nodes = informer_of(obj("x", "1")), Informer("nodes", lister(obj("x", "1", namespace=None)))
    nodes.relist()
    written = WrittenObjects()
    written.wrote("nodes", nodes.get("x"), obj("x", "2", namespace=None))
    written.wrote("pods", pods.get("ns/x"), {"metadata": {"name": "x", "namespace": "ns"}})
    assert len(written) == 1
    assert names_and_versions(written.overlay("pods", pods, pods.items())) == [("x", "1")]
    assert names_and_versions(written.overlay("nodes", nodes, nodes.items())) == [("x", "2")]


def test_an_object_we_created_is_listed_until_the_cache_holds_it() -> None:
    """The controller's own ResourceClaims: a cycle before their watch events must count them."""
    cache = informer_of(obj("other", "1"))
    written = WrittenObjects()
    written.follow("claims", cache)
    written.wrote("claims", cache.get("ns/mine"), obj("mine", "7"))
    assert names_and_versions(written.overlay("claims", cache, cache.items())) == [("other", "1"), ("mine", "7")]
    cache.apply({"type": "ADDED", "object": obj("mine", "7")})
    assert names_and_versions(written.overlay("claims", cache, cache.items())) == [("other", "1"), ("mine", "7")]
    assert len(written) == 0


def test_an_object_deleted_and_created_again_by_us_is_read_through_the_old_ones_delete_event() -> None:
    old = obj("c", "1")
    old["metadata"]["uid"] = "uid-old"
    cache = informer_of(old)
    written = WrittenObjects()
    written.follow("claims", cache)
    written.forget("claims", "ns/c")  # we deleted the old one
    new = obj("c", "9")
    new["metadata"]["uid"] = "uid-new"
    written.wrote("claims", cache.get("ns/c"), new)  # and created it again
    gone = obj("c", "8")
    gone["metadata"]["uid"] = "uid-old"
    cache.apply({"type": "DELETED", "object": gone})  # the old one's delete arrives
    assert names_and_versions(written.overlay("claims", cache, cache.items())) == [("c", "9")]
    deleted_new = obj("c", "10")
    deleted_new["metadata"]["uid"] = "uid-new"
    cache.apply({"type": "DELETED", "object": deleted_new})  # our own one deleted: forgotten
    assert written.overlay("claims", cache, cache.items()) == []
