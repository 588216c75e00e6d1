"""The GenTD26 usage-trace reader (sharing.usage.trace): columns by header, the grid, and the rules for bad input."""

from __future__ import annotations

import pytest

from sharing.usage.trace import MAX_MEMORY_BYTES, UsageTraceError, parse_usage

GB = 10**9


def duty_file(*rows: tuple[float | str, float, str]) -> list[str]:
    """Rows (value, time, pod) in the duty file's published column order."""
    return ["value,timestamp_anon,container_ip", *(f"{v},{t},{p}" for v, t, p in rows)]


def memory_file(*rows: tuple[float | str, float, str]) -> list[str]:
    """Rows (value, time, pod) in the memory file's published column order (time first)."""
    return ["timestamp_anon,value,container_ip", *(f"{t},{v},{p}" for v, t, p in rows)]


def test_columns_are_read_by_header_and_pods_join_by_container_ip() -> None:
    trace = parse_usage(
        duty_file((5.0, 0, "a"), (7.5, 57, "a"), (1.0, 57, "b"), (2.0, 114, "b")),
        memory_file((20 * GB, 0, "a"), (21 * GB, 57, "a"), (30 * GB, 57, "b"), (31 * GB, 114, "b")),
    )
    assert (trace.start_s, trace.step_s, trace.steps) == (0, 57, 3)
    a, b = trace.pods
    assert (a.pod, a.first_step, a.duty_percent, a.memory_bytes) == ("a", 0, (5.0, 7.5), (20 * GB, 21 * GB))
    assert (b.pod, b.first_step, b.end_step, b.duty_percent) == ("b", 1, 3, (1.0, 2.0))
    assert trace.duty.rows == 4 and trace.memory.filled == 0


def test_gaps_take_the_last_value_and_before_the_first_the_first() -> None:
    trace = parse_usage(
        duty_file((10.0, 0, "a"), (0.0, 57, "a"), (30.0, 171, "a")),  # step 2 missing
        memory_file((5 * GB, 57, "a"), (6 * GB, 114, "a"), (7 * GB, 171, "a")),  # step 0 missing
    )
    (pod,) = trace.pods
    assert pod.duty_percent == (10.0, 0.0, 0.0, 30.0)
    assert pod.memory_bytes == (5 * GB, 5 * GB, 6 * GB, 7 * GB)
    assert (trace.duty.filled, trace.memory.filled) == (1, 1)


@pytest.mark.parametrize(
    ("value", "counted"),
    [("nan", "nan"), ("inf", "nan"), ("", "nan"), ("x", "nan"), ("-1", "negative"), ("100.5", "absurd")],
    ids=["nan", "infinite", "empty", "not-a-number", "negative", "over-100-percent"],
)
def test_a_bad_duty_value_is_dropped_counted_and_filled(value: str, counted: str) -> None:
    trace = parse_usage(duty_file((4.0, 0, "a"), (value, 57, "a"), (6.0, 114, "a")),
                        memory_file((1 * GB, 0, "a"), (1 * GB, 114, "a")))
    assert trace.pods[0].duty_percent == (4.0, 4.0, 6.0)
    assert getattr(trace.duty, counted) == 1
    assert trace.duty.filled == 1


def test_memory_beyond_any_gpu_is_absurd() -> None:
    trace = parse_usage(duty_file((1.0, 0, "a"), (1.0, 57, "a")),
                        memory_file((2 * GB, 0, "a"), (MAX_MEMORY_BYTES + 1, 57, "a")))
    assert trace.memory.absurd == 1
    assert trace.pods[0].memory_bytes == (2 * GB, 2 * GB)


def test_off_grid_times_snap_and_a_second_sample_on_a_step_is_a_duplicate() -> None:
    trace = parse_usage(
        duty_file((1.0, 0, "a"), (2.0, 57, "a"), (3.0, 114, "a"), (9.0, 115, "a"), (3.0, 114, "a")),
        memory_file((1 * GB, 0, "a"), (1 * GB, 57, "a"), (1 * GB, 116, "a")),
    )
    assert trace.step_s == 57
    assert trace.pods[0].duty_percent == (1.0, 2.0, 3.0)
    assert trace.duty.duplicate == 2  # 114 read twice, and 115 lands on 114's step
    assert trace.memory.duplicate == 0


def test_a_pod_without_memory_samples_is_left_out() -> None:
    trace = parse_usage(duty_file((1.0, 0, "a"), (1.0, 57, "a"), (1.0, 0, "b")),
                        memory_file((1 * GB, 0, "a"), ("nan", 0, "b")))
    assert [p.pod for p in trace.pods] == ["a"]
    assert trace.left_out == ("b",)


@pytest.mark.parametrize(
    ("duty", "memory", "message"),
    [
        (["value,timestamp_anon"], memory_file(), "duty:1: missing column(s) container_ip"),
        (duty_file() + ["1.0,0"], memory_file(), "duty:2: expected 3 fields, got 2"),
        (duty_file() + ["1.0,0,"], memory_file(), "duty:2: empty container_ip"),
        (duty_file(), memory_file() + ["soon,1,a"], "memory:2: timestamp_anon must be a number, got 'soon'"),
        (duty_file((1.0, 0, "a")), memory_file((1.0, 0, "a")), "samples at two different times"),
        (duty_file((1.0, 0, "a"), (1.0, 57, "a")), memory_file(), "no pod has usable samples"),
        ([], memory_file(), "duty:1: missing column(s) value, timestamp_anon, container_ip"),
    ],
    ids=["missing-column", "short-row", "no-pod", "bad-time", "one-time", "no-memory", "empty-file"],
)
def test_bad_input_is_refused_naming_source_and_line(duty: list[str], memory: list[str], message: str) -> None:
    with pytest.raises(UsageTraceError) as caught:
        parse_usage(duty, memory, duty_source="duty", memory_source="memory")
    assert message in str(caught.value)
