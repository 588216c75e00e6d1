"""The usage-trace player (``sharing.usage.playback``): scaled time, a trace pod's life, who plays whom,
bad settings, and the pod mapping file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpupack.cli import load_usage_trace
from gpupack.testing.usage_traces import GIB, write_usage_trace
from sharing.usage.playback import PlaybackError, PlayedUse, TracePlayer, parse_pod_mapping
from sharing.usage.trace import DUTY_FILE, UsageTrace

START = 5000.0


@pytest.fixture
def trace(tmp_path: Path) -> UsageTrace:
    # p-late joins at step 2; p-short ends after step 1; the trace's step is 60 s.
    return load_usage_trace(write_usage_trace(tmp_path / "t", {
        "p-b": [(10.0, 1 * GIB), (20.0, 2 * GIB), (30.0, 3 * GIB), (40.0, 4 * GIB)],
        "p-a": [(50.0, 5 * GIB), (60.0, 6 * GIB)],
        "p-late": [(70.0, 7 * GIB), (80.0, 8 * GIB)],
    }, first={"p-late": 2}))


@pytest.mark.parametrize(("scale", "elapsed", "step"), [
    (60.0, 0.0, 0), (60.0, 0.99, 0), (60.0, 1.0, 1), (60.0, 3.5, 3),
    (120.0, 0.5, 1), (120.0, 1.0, 2), (1.0, 59.0, 0), (1.0, 60.0, 1), (60.0, -0.5, -1),
], ids=lambda v: str(v))
def test_the_trace_step_is_the_scaled_elapsed_time_over_its_step(trace: UsageTrace, scale: float, elapsed: float,
                                                                 step: int) -> None:
    assert TracePlayer(trace, time_scale=scale, start_s=START).step(START + elapsed) == step


def test_a_pod_plays_its_samples_and_idles_outside_its_life(trace: UsageTrace) -> None:
    player = TracePlayer(trace, time_scale=60.0, start_s=START)
    assert player.use("p-b", START + 1.5) == PlayedUse(20.0, 2 * GIB, True)
    assert player.use("p-late", START + 2.0) == PlayedUse(70.0, 7 * GIB, True)
    # before its first sample (and before the start): 0 %, holding its first memory
    assert player.use("p-late", START + 1.0) == PlayedUse(0.0, 7 * GIB, False)
    assert player.use("p-b", START - 10.0) == PlayedUse(0.0, 1 * GIB, False)
    # after its last sample: 0 %, holding its last memory, for ever
    assert player.use("p-a", START + 2.0) == PlayedUse(0.0, 6 * GIB, False)
    assert player.use("p-b", START + 1e6) == PlayedUse(0.0, 4 * GIB, False)
    with pytest.raises(KeyError):
        player.use("ghost", START)


def test_processes_take_trace_pods_in_order_of_appearance_then_the_least_played(trace: UsageTrace) -> None:
    player = TracePlayer(trace, time_scale=60.0, start_s=START)
    assert player.order == ("p-a", "p-b", "p-late")  # by first sample, then name
    playing: list[str] = []
    for _ in range(5):
        playing.append(player.choose("", playing))
    assert playing == ["p-a", "p-b", "p-late", "p-a", "p-b"]
    # a process of p-b ended: p-b, played by no process now, goes to the next one
    assert player.choose("", ["p-a", "p-a", "p-late"]) == "p-b"


def test_an_explicit_mapping_binds_by_the_owner_and_keeps_its_pods_for_it(trace: UsageTrace) -> None:
    player = TracePlayer(trace, time_scale=60.0, start_s=START, pods={"ml/a": "p-late"})
    assert player.choose("ml/a", []) == "p-late"
    assert player.choose("ml/a", ["p-late"]) == "p-late"  # a second replica of the pod plays it too
    others: list[str] = []
    for _ in range(3):
        others.append(player.choose("ml/other", others))
    assert others == ["p-a", "p-b", "p-a"]  # p-late is the mapped pod's, not for order of appearance


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"time_scale": 0.0}, "usage time scale must be a number above 0"),
    ({"time_scale": -60.0}, "usage time scale must be a number above 0"),
    ({"time_scale": math.nan}, "usage time scale must be a number above 0"),
    ({"time_scale": math.inf}, "usage time scale must be a number above 0"),
    ({"start_s": math.nan}, "usage trace start must be a finite time"),
    ({"pods": {"ml/a": "ghost"}}, "names trace pod(s) the trace does not hold: ghost"),
], ids=["zero", "negative", "nan", "inf", "nan-start", "unknown-pod"])
def test_bad_settings_are_refused(trace: UsageTrace, kwargs: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"time_scale": 60.0, "start_s": START, **kwargs}
    with pytest.raises(PlaybackError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TracePlayer(trace, **settings)  # type: ignore[arg-type]


def test_bad_values_are_played_as_the_reader_fills_them(tmp_path: Path) -> None:
    folder = write_usage_trace(tmp_path / "t", {"p": [(10.0, GIB), (20.0, GIB), (30.0, GIB), (40.0, GIB)]})
    duty = (folder / DUTY_FILE).read_text().replace("20.0,1060.0", "nan,1060.0").replace("30.0,1120.0", "-5,1120.0")
    (folder / DUTY_FILE).write_text(duty.replace("40.0,1180.0", "250,1180.0"))
    trace = load_usage_trace(folder)
    assert (trace.duty.nan, trace.duty.negative, trace.duty.absurd) == (1, 1, 1)
    player = TracePlayer(trace, time_scale=60.0, start_s=START)
    # NaN, negative and absurd samples are dropped; the last good value holds
    assert [player.use("p", START + s).duty_percent for s in range(4)] == [10.0, 10.0, 10.0, 10.0]


def test_the_pod_mapping_file() -> None:
    lines = ["container_ip,pod", "10.0.0.1,ml/a", "", " 10.0.0.2 , ml/b "]
    assert parse_pod_mapping(lines, "m.csv") == {"ml/a": "10.0.0.1", "ml/b": "10.0.0.2"}


@pytest.mark.parametrize(("lines", "message"), [
    (["pod,ip", "ml/a,x"], "m.csv:1: expected the columns pod, container_ip"),
    (["pod,container_ip", "a,x"], "m.csv:2: pod must be namespace/name, got 'a'"),
    (["pod,container_ip", "ml/a,"], "m.csv:2: empty container_ip"),
    (["pod,container_ip", "ml/a,x", "ml/a,y"], "m.csv:3: pod ml/a is mapped twice"),
    (["pod,container_ip", "ml/a,x,z"], "m.csv:2: expected 2 fields, got 3"),
], ids=["columns", "not-namespaced", "empty-ip", "twice", "fields"])
def test_a_bad_mapping_file_names_its_line(lines: list[str], message: str) -> None:
    with pytest.raises(PlaybackError, match=message):
        parse_pod_mapping(lines, "m.csv")
