"""GPUs split into equal replicas, as the device-plugin backend shares them (sharing.packing.replica_gpus),
and the right-sizer's replay on them (``RightSizing(backend="device-plugin")``, with publication lag)."""

from __future__ import annotations

import dataclasses

from sharing.packing.replica_gpus import ReplicaGpus
from sharing.packing.shared_gpus import FitRule, Size
from sharing.simulator.usage_figures import measure
from sharing.simulator.usage_replay import right_sizing_seatings
from tests.unit.test_usage_replay import GIB, GPU, QUICK, quiet_pods, trace_of


def test_an_idle_gpu_is_split_into_the_most_replicas_its_first_pod_fits() -> None:
    pool = ReplicaGpus(FitRule(GPU))
    assert pool.seat("a", Size(100, 15 * GIB)) == 0
    assert pool.replicas[0] == 5  # 5 x 15 GiB <= 80 GiB, 6 x 15 GiB is not
    assert pool.seat("b", Size(100, 16 * GIB)) == 0  # 16 GiB is a fifth of 80
    assert pool.seat("c", Size(100, 17 * GIB)) == 1  # more than a fifth: a new GPU, split in four
    assert pool.replicas[1] == 4


def test_a_replica_count_caps_the_pods_and_an_empty_gpu_is_split_anew() -> None:
    pool = ReplicaGpus(FitRule(GPU))
    pool.seat("a", Size(400, 30 * GIB))  # two replicas: 2 x 400 milli, 2 x 30 GiB
    pool.seat("b", Size(100, 10 * GIB))
    assert pool.seats["b"][0] == 0 and pool.seat("c", Size(100, 10 * GIB)) == 1  # both replicas taken
    pool.leave("a")
    pool.leave("b")
    assert 0 not in pool.replicas
    pool.place("d", Size(1000, GPU), 0)  # a whole GPU: one replica
    assert pool.replicas[0] == 1 and not pool.admits(0, Size(1, GIB))
    fork = pool.fork()
    fork.leave("d")
    assert pool.replicas[0] == 1 and 0 not in fork.replicas


def test_a_share_goes_where_the_fewest_replicas_are_left() -> None:
    pool = ReplicaGpus(FitRule(GPU))
    pool.place("a", Size(100, 10 * GIB), 0)  # eight replicas, seven free
    pool.place("b", Size(300, 20 * GIB), 1)  # three replicas, two free
    assert pool.seat("c", Size(100, 10 * GIB)) == 1


def test_the_device_plugin_replay_splits_in_replicas_and_publication_delays_recommendations() -> None:
    trace = trace_of(quiet_pods(3, 120, [30 * GIB] * 120))
    replicas = dataclasses.replace(QUICK, backend="device-plugin")
    last = dict(list(right_sizing_seatings(trace, GPU, replicas))[-1])
    assert sorted(s.gpu for s in last.values()).count(last["p0"].gpu) == 2  # 33 GiB shares: two replicas a GPU
    assert len({s.gpu for s in dict(list(right_sizing_seatings(trace, GPU, QUICK))[-1]).values()}) == 2  # exact too
    at_once = measure(trace, GPU, right_sizing_seatings(trace, GPU, replicas))
    lagged = measure(trace, GPU, right_sizing_seatings(trace, GPU, dataclasses.replace(replicas,
                                                                                       publish_every_s=420.0)))
    # History published at 7-step marks: the 10-step minimum is seen at step 14.
    assert 0 < lagged.gpu_hours_saved_pct < at_once.gpu_hours_saved_pct
