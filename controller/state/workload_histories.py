"""Each workload container's history, from its live pods' and its gone pods': what every usage source shares.

A usage source (``controller.usage_source``: the node agents'; ``controller.usage_prometheus``:
a Prometheus server's) keeps one history per live pod container, however it reads it, and hands
them to :meth:`WorkloadHistories.update` each feed. The rules, one implementation for both:

* A pod container that is no longer among the live ones has **gone**: its history is folded
  into its workload container's gone part, its pod counted and the GPU memory it ran on kept.
  A rollout does not forget the use of the pods it replaced.
* The gone part is what the ``GPURecommendation``'s ``status.checkpoint`` keeps
  (:meth:`checkpoint`); a new leader starts from it (:meth:`reset`) and reads the live pods'
  histories from the source again. Live pods are never in a checkpoint, so a restarted
  controller that reads them again counts nothing twice.
* A workload container's history is its gone part merged with its live pods'
  (``sharing.usage.compact.merged``), written into the recommender's histories.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharing.api.crd import UsageHistory
from sharing.usage.compact import LimitHits, encode, merged
from sharing.usage.recommender import ContainerHistory, Recommender, RecommenderSettings, WorkloadKey

PodKey = tuple[str, str, str]
"""(``namespace/name``, pod uid, container)"""


@dataclass(frozen=True)
class PodHistory:
    """One live pod container's history (memory-limit hits applied) and the GPU memory it ran on."""

    key: WorkloadKey
    history: ContainerHistory
    gpu_memory_mib: int


@dataclass(frozen=True)
class GonePart:
    """A workload container's gone pods, as a checkpoint keeps them."""

    key: WorkloadKey
    history: ContainerHistory
    pods: int
    gpu_memory_mib: int


class WorkloadHistories:
    """Live pods' histories and gone parts per workload container (module docstring)."""

    def __init__(self, settings: RecommenderSettings) -> None:
        self.settings = settings
        self.live: dict[PodKey, PodHistory] = {}
        self.gone: dict[WorkloadKey, ContainerHistory] = {}
        self.gone_pods: dict[WorkloadKey, int] = {}
        self.gone_memory_mib: dict[WorkloadKey, int] = {}

    def reset(self, parts: Iterable[GonePart]) -> None:
        """Start a leader's term from the checkpoints' gone parts, forgetting every live pod: the
        source reads those again. (Kept live pods would be folded a second time when they go, if
        the last leader already folded them into the checkpoint.)"""
        self.live, self.gone, self.gone_pods, self.gone_memory_mib = {}, {}, {}, {}
        for part in parts:
            self.gone[part.key] = part.history
            self.gone_pods[part.key] = part.pods
            self.gone_memory_mib[part.key] = part.gpu_memory_mib

    def update(self, live: Mapping[PodKey, PodHistory], recommender: Recommender) -> None:
        """The live pod containers now: fold those that went, and give the recommender each
        workload container's history (gone part and live pods merged)."""
        for pod_key, went in self.live.items():
            if pod_key not in live:
                self.gone[went.key] = merged([h for h in (self.gone.get(went.key), went.history) if h is not None],
                                             self.settings)
                self.gone_pods[went.key] = self.gone_pods.get(went.key, 0) + 1
                self.gone_memory_mib[went.key] = max(self.gone_memory_mib.get(went.key, 0), went.gpu_memory_mib)
        self.live = dict(live)
        parts: dict[WorkloadKey, list[ContainerHistory]] = {key: [h] for key, h in self.gone.items()}
        for pod in self.live.values():
            parts.setdefault(pod.key, []).append(pod.history)
        for key, histories in parts.items():
            recommender.histories[key] = merged(histories, self.settings)

    def live_pods(self) -> dict[WorkloadKey, int]:
        counts: dict[WorkloadKey, int] = {}
        for pod in self.live.values():
            counts[pod.key] = counts.get(pod.key, 0) + 1
        return counts

    def gpu_memory_mib(self) -> dict[WorkloadKey, int]:
        """The largest GPU memory each workload container's pods (live or gone) were seen on."""
        out: dict[WorkloadKey, int] = dict(self.gone_memory_mib)
        for pod in self.live.values():
            out[pod.key] = max(out.get(pod.key, 0), pod.gpu_memory_mib)
        return out

    def checkpoint(self, key: WorkloadKey) -> UsageHistory | None:
        """The gone part of ``key`` in the checkpoint's compact form; None when no pod of it has gone."""
        gone = self.gone.get(key)
        return None if gone is None else encode(gone, LimitHits(gone.ooms), self.gone_memory_mib.get(key, 0))


__all__ = ["GonePart", "PodHistory", "PodKey", "WorkloadHistories"]
