"""kube.safejson and the informer on it: a document holding JSON nested as deep as the API server
stores (about 10,000 levels) still decodes, and only the object holding the deep subtree is lost
(issue 33, item 2: one deep GPUNode status blinded every GPUNode watch)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kube import safejson
from kube.informer import Informer, object_key


def deep_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def node_json(name: str, rv: str, reconfiguration: str = "null") -> str:
    return (f'{{"metadata":{{"name":"{name}","resourceVersion":"{rv}"}},'
            f'"status":{{"reconfiguration":{reconfiguration}}}}}')


@pytest.mark.parametrize("depth", [1_500, 10_000])
@pytest.mark.parametrize("build", [deep_array, deep_object], ids=["arrays", "objects"])
def test_deep_document_decodes_with_the_deep_subtree_pruned(depth: int, build: Any) -> None:
    text = '{"kept":"x","deep":' + build(depth) + "}"
    with pytest.raises(RecursionError):  # the stdlib decoder fails the whole document
        json.loads(text)
    value, cuts = safejson.loads(text.encode())
    assert cuts == 1 and value["kept"] == "x"
    # what is left nests no deeper than the limit, and the cut is marked where it was
    assert not safejson.deeper_than(json.dumps(value))
    assert safejson.holds_pruned(value["deep"])


def test_brackets_and_escaped_quotes_inside_strings_are_not_structure() -> None:
    tricky = '"[[[{{{ \\" ]]] \\\\"'  # a string with brackets, an escaped quote and an escaped backslash
    text = '{"s":' + tricky + ',"t":"' + "[" * 5_000 + '"}'
    assert not safejson.deeper_than(text, 3)
    value, cuts = safejson.loads(text, limit=3)
    assert cuts == 0 and value == json.loads(text)
    # a deep value after such strings is still found and cut at the right place
    text = '{"s":' + tricky + ',"d":' + deep_array(6) + ',"after":"]}"}'
    value, cuts = safejson.loads(text, limit=3)
    assert cuts == 1 and value == {"s": json.loads(tricky), "d": [[safejson.PRUNED]], "after": "]}"}


def test_shallow_documents_are_decoded_unchanged() -> None:
    text = json.dumps({"items": [{"a": [1, {"b": "[{"}]}], "n": None})
    assert safejson.loads(text) == (json.loads(text), 0)


def test_not_json_is_a_value_error_not_a_recursion_error() -> None:
    for text in ("[" * 10_000, '{"a":' * 5_000, "{]", "[1,"):
        with pytest.raises(ValueError):
            safejson.loads(text)


def test_list_with_one_deep_item_keeps_every_other_item() -> None:
    text = ('{"metadata":{"resourceVersion":"9"},"items":['
            + node_json("a", "1") + "," + node_json("bad", "2", deep_array(10_000)) + "," + node_json("c", "3") + "]}")
    value, cuts = safejson.loads(text)
    assert cuts == 1
    assert [safejson.holds_pruned(i) for i in value["items"]] == [False, True, False]


class Answer:
    def __init__(self, body: bytes = b"", chunks: list[bytes] | None = None) -> None:
        self.data, self.chunks = body, chunks or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.chunks

    def release_conn(self) -> None:
        pass


class RawLister:
    """Answers raw text, so a test can send what ``json.dumps`` itself cannot write."""

    def __init__(self, lists: list[str], watches: list[list[str]]) -> None:
        self.lists, self.watches = lists, watches

    def __call__(self, **kw: Any) -> Answer:
        if kw.get("watch"):
            return Answer(chunks=["".join(line + "\n" for line in self.watches.pop(0)).encode()])
        return Answer(self.lists.pop(0).encode())


def test_informer_leaves_out_only_the_deep_object_from_a_list_and_a_watch() -> None:
    deep = deep_array(1_500)
    lister = RawLister(
        ['{"metadata":{"resourceVersion":"9"},"items":[' + node_json("a", "1") + ","
         + node_json("bad", "2", deep) + "," + node_json("c", "3") + "]}"],
        [[f'{{"type":"MODIFIED","object":{node_json("a", "10", deep)}}}',
          f'{{"type":"MODIFIED","object":{node_json("c", "11", "{}")}}}',
          f'{{"type":"MODIFIED","object":{node_json("bad", "12", "{}")}}}']])
    seen: list[tuple[str, str]] = []
    informer = Informer("gpunodes", lister)
    informer.listeners.append(lambda kind, obj: seen.append((kind, object_key(obj))))
    informer.relist()
    assert informer.synced and sorted(object_key(o) for o in informer.items()) == ["a", "c"]
    assert informer.rejected == {"bad": f"nested deeper than {safejson.MAX_DEPTH} levels"}
    informer.watch_once()  # must not raise: the deep event costs node a, and the watch goes on
    assert sorted(object_key(o) for o in informer.items()) == ["bad", "c"]
    item = informer.get("c")
    assert item is not None and item["status"] == {"reconfiguration": {}}
    assert informer.rejected == {"a": f"nested deeper than {safejson.MAX_DEPTH} levels"}
    assert ("DELETED", "a") in seen and ("MODIFIED", "c") in seen and ("MODIFIED", "bad") in seen


def test_informer_leaves_out_an_object_its_keep_function_fails_on() -> None:
    def keep(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "bad":
            raise RecursionError("maximum recursion depth exceeded")
        return obj

    lister = RawLister(['{"metadata":{"resourceVersion":"9"},"items":[' + node_json("a", "1") + ","
                        + node_json("bad", "2") + "]}"], [])
    informer = Informer("gpunodes", lister, keep=keep)
    informer.relist()
    assert [object_key(o) for o in informer.items()] == ["a"]
    assert informer.rejected["bad"].startswith("unreadable: RecursionError")


def test_record_annotation_nested_deep_is_a_clear_error() -> None:
    from sharing.api.json_records import json_record

    for text in ("[" * 50_000 + "]" * 50_000, '{"a":' * 20_000 + "1" + "}" * 20_000):
        with pytest.raises(ValueError, match="nested too deep|longer than"):
            json_record(text, "gpupack.io/allocation", ValueError)
    with pytest.raises(ValueError, match="nested too deep"):
        json_record("[" * 5_000 + "]" * 5_000, "gpupack.io/allocation", ValueError)


def test_list_items_leaves_out_and_names_only_the_deep_object() -> None:
    text = ('{"items":[' + node_json("a", "1") + ","
            + '{"metadata":{"namespace":"t","name":"bad"},"spec":' + deep_object(10_000) + "}," + node_json("c", "3") + "]}")
    items, left_out = safejson.list_items(text.encode())
    assert [i["metadata"]["name"] for i in items] == ["a", "c"] and left_out == ["t/bad"]


def test_webhook_inventory_is_synced_with_every_other_node_when_one_gpunode_is_deep() -> None:
    """A restarted webhook listing a GPUNode nested 1,500 deep (stored before the schema was typed)
    becomes ready with the other nodes; the same node's deep watch event takes only that node out."""
    from tests.unit.test_webhook_inventory_watch import gpunode, scripted
    from webhook.inventory_source import InventoryHolder
    from webhook.inventory_watch import KubernetesWatch

    good = json.dumps(gpunode("a", "5"))
    deep_b = json.dumps(gpunode("b", "6")).replace('"status": {', '"status": {"reconfiguration": '
                                                   + deep_array(1_500) + ", ", 1)
    deep_a = json.dumps(gpunode("a", "7")).replace('"status": {', '"status": {"reconfiguration": '
                                                   + deep_object(1_500) + ", ", 1)
    gpunodes = RawLister(['{"metadata":{"resourceVersion":"9"},"items":[' + good + "," + deep_b + "]}"],
                         [['{"type":"MODIFIED","object":' + deep_a + "}",
                           '{"type":"MODIFIED","object":' + json.dumps(gpunode("b", "8")) + "}"]])
    watch = KubernetesWatch(InventoryHolder(), scripted(gpunodes))  # type: ignore[arg-type]
    for informer in watch.informers.values():
        informer.relist()
    inventory = watch.publish_pending()
    assert inventory is not None and inventory.synced and [n.name for n in inventory.nodes] == ["a"]
    watch.informers["GPUNode"].watch_once()
    inventory = watch.publish_pending()
    assert inventory is not None and [n.name for n in inventory.nodes] == ["b"]


def test_controller_caches_keep_waking_the_cycle_for_other_nodes_after_a_deep_one() -> None:
    """The controller's GPUNode cache: after a deep event for one node, another node's update
    (its agent reporting Succeeded) still arrives and wakes the cycle."""
    from controller.watch_caches import ClusterCaches

    woken: list[str] = []
    gpunodes = RawLister(['{"metadata":{"resourceVersion":"9"},"items":[' + node_json("a", "1") + ","
                          + node_json("b", "2") + "]}"],
                         [[f'{{"type":"MODIFIED","object":{node_json("a", "10", deep_object(1_500))}}}',
                           f'{{"type":"MODIFIED","object":{node_json("b", "11", json.dumps({"phase": "Succeeded"}))}}}']])
    caches = ClusterCaches({"gpunodes": gpunodes}, on_change=woken.append)
    informer = caches.informers["gpunodes"]
    informer.relist()
    informer.watch_once()
    b = informer.get("b")
    assert b is not None and b["status"]["reconfiguration"] == {"phase": "Succeeded"}
    assert informer.get("a") is None and list(informer.rejected) == ["a"] and "gpunodes" in woken


def test_mig_parted_config_nested_deep_is_a_config_error() -> None:
    """mig-manager's ConfigMap, which the controller reads every cycle that publishes a config."""
    from mig.migparted import MigConfigError, parse_config

    for text in ("[" * 100_000, "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 3_000))):
        with pytest.raises(MigConfigError):
            parse_config(text)


def test_gpunode_json_annotations_nested_deep_read_as_malformed() -> None:
    """The health acknowledgement (admin) and idle-since (controller) annotations of a GPUNode."""
    from controller.state.build import idle_record
    from node.health.ack import read_acknowledgements
    from sharing.api.keys import HEALTH_ACK_ANNOTATION, IDLE_SINCE_ANNOTATION

    deep = "[" * 50_000 + "]" * 50_000
    acks = read_acknowledgements({HEALTH_ACK_ANNOTATION: deep})
    assert not acks.until and acks.problem is not None and "too deep" in acks.problem
    assert idle_record({"metadata": {"annotations": {IDLE_SINCE_ANNOTATION: deep}}}) == {}
