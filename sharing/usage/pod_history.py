"""How one pod container's sample and memory-limit hit go into its own history: one rule for every usage source.

The node agent (``node.usage.publication``, published in its GPUNode's ``status.usage``) and the
controller's Prometheus source (``controller.usage_prometheus``) each keep a history per pod
container (``sharing.usage.recommender.ContainerHistory``); both add to it here, so a pod is
learned the same way whichever source the recommender reads.

* **A sample whose compute is not the pod's own** (``duty_percent`` None, its memory known: an
  MPS client, whose SM time NVML gives only to the MPS server) adds its memory peak and nothing
  else, and makes the history memory-only for the pod's life: the duty samples it had are dropped
  (``sharing.usage.compact.memory_only``), later duty samples add their memory alone. The duty
  histogram, sample count and first and last time measure the compute observed; the recommender's
  minimum history and confidence read them, so memory-only time does not count as observed (it
  extends the memory's, ``ContainerHistory.observe_memory``, which the memory margin reads). A
  history with holes where the compute was unknown would understate it; hence the stickiness.
* **A memory-limit hit** raises the pod's memory as ``Recommender.record_oom`` does (the limit in
  force times the OOM bump), in the pod's own history, which the controller merges into its
  workload's (``controller.state.workload_histories``).

Pure: no clock, no I/O.
"""

from __future__ import annotations

from sharing.usage.compact import memory_only
from sharing.usage.recommender import ContainerHistory, Recommender, RecommenderSettings, WorkloadKey


def add_sample(history: ContainerHistory, settings: RecommenderSettings, time_s: float, duty_percent: float | None,
               memory_bytes: float, *, was_memory_only: bool) -> ContainerHistory:
    """``history`` with one sample of its pod container added (module docstring); the history to keep from now
    on, a new memory-only one when the compute has just become unknown. ``was_memory_only``: an earlier
    sample's compute was unknown (the caller keeps that mark for the pod's life)."""
    if duty_percent is None and not was_memory_only:
        floors = history.oom_floor
        history = memory_only(history, settings)
        history.oom_floor = floors  # hits already applied stay (memory_only keeps peaks and the count)
    if duty_percent is None or was_memory_only:
        history.observe_memory(time_s, round(memory_bytes))
    else:
        history.observe(time_s, duty_percent, round(memory_bytes))
    return history


def record_hit(history: ContainerHistory, settings: RecommenderSettings, time_s: float, limit_bytes: int) -> None:
    """A memory-limit hit of the pod at ``time_s`` with ``limit_bytes`` in force, into its own ``history``:
    exactly ``Recommender.record_oom``'s bump and count."""
    scratch = Recommender(settings)
    key = WorkloadKey("", "", "", "")
    scratch.histories[key] = history
    scratch.record_oom(key, time_s, limit_bytes)


__all__ = ["add_sample", "record_hit"]
