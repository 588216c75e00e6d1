"""kube.informer: list, watch, resume, expiry and listeners, against a scripted lister."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kube.informer import Informer, WatchExpired, object_key, wait_all_synced


def pod(name: str, rv: str, namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": rv}}


class Answer:
    """What the client returns with ``_preload_content=False``."""

    def __init__(self, body: bytes = b"", chunks: list[bytes] | None = None) -> None:
        self.data = body
        self.chunks = chunks or []
        self.released = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.chunks

    def release_conn(self) -> None:
        self.released = True

    def close(self) -> None:
        pass


class ScriptedLister:
    def __init__(self, lists: list[dict[str, Any]], watches: list[list[dict[str, Any]]]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kw: Any) -> Answer:
        self.calls.append(kw)
        if kw.get("watch"):
            events = self.watches.pop(0)
            text = "".join(json.dumps(e) + "\n" for e in events).encode()
            # split mid-line: the reader must join chunks
            return Answer(chunks=[text[:7], text[7:]])
        return Answer(json.dumps(self.lists.pop(0)).encode())


def listing(rv: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}, "items": list(items)}


def test_object_key_namespaced_and_cluster_scoped() -> None:
    assert object_key(pod("a", "1")) == "ns/a"
    assert object_key({"metadata": {"name": "node-1"}}) == "node-1"


def test_list_then_watch_applies_events_and_resumes_from_last_version() -> None:
    lister = ScriptedLister([listing("10", pod("a", "5"))], [
        [{"type": "ADDED", "object": pod("b", "11")}, {"type": "MODIFIED", "object": pod("a", "12")},
         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}],
        [{"type": "DELETED", "object": pod("b", "16")}],
    ])
    seen: list[tuple[str, str]] = []
    informer = Informer("pods", lister)
    informer.listeners.append(lambda kind, obj: seen.append((kind, object_key(obj))))
    informer.relist()
    assert informer.synced and [object_key(o) for o in informer.items()] == ["ns/a"]
    informer.watch_once()
    assert sorted(object_key(o) for o in informer.items()) == ["ns/a", "ns/b"]
    assert informer.get("ns/a") == pod("a", "12")
    informer.watch_once()
    assert informer.get("ns/b") is None
    # the first watch starts at the list's version, the second at the bookmark's
    watches = [c for c in lister.calls if c.get("watch")]
    assert [c["resource_version"] for c in watches] == ["10", "15"]
    assert all(c["allow_watch_bookmarks"] for c in watches)
    assert seen == [("ADDED", "ns/a"), ("ADDED", "ns/b"), ("MODIFIED", "ns/a"), ("DELETED", "ns/b")]
    assert informer.version == 4 and informer.lists == 1


def test_expired_watch_raises_so_the_loop_lists_again() -> None:
    informer = Informer("pods", ScriptedLister([listing("1")], [[{"type": "ERROR", "object": {"code": 410}}]]))
    informer.relist()
    with pytest.raises(WatchExpired):
        informer.watch_once()


def test_relist_tells_listeners_only_what_changed() -> None:
    lister = ScriptedLister([listing("1", pod("a", "1"), pod("b", "1")),
                             listing("9", pod("a", "1"), pod("b", "7"), pod("c", "8"))], [])
    informer = Informer("pods", lister)
    informer.relist()
    seen: list[tuple[str, str]] = []
    informer.listeners.append(lambda kind, obj: seen.append((kind, object_key(obj))))
    before = informer.version
    informer.relist()
    assert sorted(seen) == [("ADDED", "ns/c"), ("MODIFIED", "ns/b")]
    assert informer.version == before + 1


def test_relist_drops_objects_gone_meanwhile() -> None:
    lister = ScriptedLister([listing("1", pod("a", "1"), pod("b", "1")), listing("2", pod("a", "1"))], [])
    informer = Informer("pods", lister)
    seen: list[tuple[str, str]] = []
    informer.listeners.append(lambda kind, obj: seen.append((kind, object_key(obj))))
    informer.relist()
    informer.relist()
    assert [object_key(o) for o in informer.items()] == ["ns/a"]
    assert seen[-1] == ("DELETED", "ns/b")


def test_keep_trims_what_is_stored() -> None:
    informer = Informer("pods", ScriptedLister([listing("1", {**pod("a", "1"), "status": {"big": 1}})], []),
                        keep=lambda o: {"metadata": o["metadata"]})
    informer.relist()
    assert "status" not in (informer.get("ns/a") or {})


def test_a_failing_listener_does_not_stop_the_cache() -> None:
    informer = Informer("pods", ScriptedLister([listing("1", pod("a", "1"))], []))

    def broken(kind: str, obj: Any) -> None:
        raise RuntimeError("bug")

    informer.listeners.append(broken)
    informer.relist()
    assert informer.get("ns/a") is not None


def test_the_thread_lists_again_after_a_failure_and_wait_changed_wakes() -> None:
    class Flaky(ScriptedLister):
        def __call__(self, **kw: Any) -> Answer:
            if kw.get("watch") and not self.watches:
                raise ConnectionError("API server away")
            return super().__call__(**kw)

    lister = Flaky([listing("1"), listing("3", pod("a", "3"))], [[]])
    informer = Informer("pods", lister, max_backoff_s=0.01)
    informer.start()
    try:
        assert wait_all_synced([informer], 10) == []
        version = informer.version
        for _ in range(200):
            if informer.get("ns/a") is not None:
                break
            version = informer.wait_changed(version, 0.5)
        assert informer.get("ns/a") == pod("a", "3")
        assert informer.lists >= 2
    finally:
        informer.stop()


def test_stop_ends_a_watch_blocked_on_a_quiet_stream() -> None:
    """A real HTTP stream on loopback that sends its headers and then nothing: stop() must wake the reader."""
    import socket

    import urllib3

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    held: list[socket.socket] = []

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        held.append(conn)  # and say nothing more

    import threading

    threading.Thread(target=serve, daemon=True).start()
    pool = urllib3.PoolManager()

    def lister(**kw: Any) -> Any:
        if kw.get("watch"):
            return pool.request("GET", f"http://127.0.0.1:{port}/watch", preload_content=False)
        return Answer(json.dumps(listing("1")).encode())

    informer = Informer("pods", lister)
    informer.start()
    assert informer.wait_synced(10)
    for _ in range(100):
        if informer._response is not None:  # noqa: SLF001 - the watch is open and blocked
            break
        threading.Event().wait(0.05)
    stopper = threading.Thread(target=informer.stop, daemon=True)  # a stop() that blocks fails, not hangs
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive()
    assert informer._thread is not None  # noqa: SLF001
    informer._thread.join(10)  # noqa: SLF001
    assert not informer._thread.is_alive()  # noqa: SLF001
    listener.close()


def test_a_list_is_read_in_pages_and_watched_from_its_snapshot() -> None:
    first = {"metadata": {"resourceVersion": "20", "continue": "page-2"}, "items": [pod("a", "5"), pod("b", "6")]}
    second = {"metadata": {"resourceVersion": "20"}, "items": [pod("c", "7")]}
    lister = ScriptedLister([first, second], [[]])
    informer = Informer("pods", lister, page_size=2)
    informer.relist()
    assert sorted(object_key(o) for o in informer.items()) == ["ns/a", "ns/b", "ns/c"]
    assert informer.list_requests == 2 and informer.lists == 1
    assert [(c.get("limit"), c.get("_continue")) for c in lister.calls] == [(2, None), (2, "page-2")]
    informer.watch_once()
    assert lister.calls[-1]["resource_version"] == "20"


def test_a_list_whose_continue_token_never_moves_fails_instead_of_looping() -> None:
    stuck = {"metadata": {"resourceVersion": "20", "continue": "again"}, "items": [pod("a", "5")]}
    informer = Informer("pods", ScriptedLister([stuck, stuck], []), page_size=1)
    with pytest.raises(RuntimeError, match="same continue token"):
        informer.relist()
    assert not informer.synced and informer.items() == []  # nothing half-listed was kept
