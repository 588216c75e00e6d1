"""Which Deployments a rollout moves make-before-break (controller.planning.right_size_rollouts)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from controller.planning.right_size_rollouts import make_before_break, rollout_patch
from sharing.api.keys import RESIZED_AT_ANNOTATION


def deployment(**spec: Any) -> dict[str, Any]:
    """A settled one-replica Deployment as the API server returns it (defaults filled in), changed by ``spec``."""
    body: dict[str, Any] = {"replicas": 1, "strategy": {"type": "RollingUpdate",
                                                        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}}
    body.update(spec)
    return {"metadata": {"name": "web", "generation": 3, "resourceVersion": "42"}, "spec": body,
            "status": {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}}


@pytest.mark.parametrize(("why", "change"), [
    ("the defaults: 25 % surge rounds up to 1, 25 % unavailable down to 0", {}),
    ("no strategy written: the API's defaults", {"strategy": {}}),
    ("integers", {"strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}),
    ("99 % unavailable still rounds down to 0", {"strategy": {"rollingUpdate": {"maxUnavailable": "99%"}}}),
])
def test_surging_deployments_move_make_before_break(why: str, change: dict[str, Any]) -> None:
    assert make_before_break(deployment(**change)) is None, why


@pytest.mark.parametrize(("change", "said"), [
    ({"strategy": {"type": "Recreate"}}, "its strategy is Recreate"),
    ({"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}, "needs maxSurge of at least 1"),
    ({"strategy": {"rollingUpdate": {"maxSurge": "0%", "maxUnavailable": "0%"}}}, "needs maxSurge of at least 1"),
    ({"strategy": {"rollingUpdate": {"maxUnavailable": "100%"}}}, "maxUnavailable 0"),
    ({"strategy": {"rollingUpdate": {"maxUnavailable": "lots"}}}, "maxUnavailable 0"),
    ({"paused": True}, "paused"),
    ({"replicas": 2}, "2 replicas"),
])
def test_others_do_not(change: dict[str, Any], said: str) -> None:
    why = make_before_break(deployment(**change))
    assert why is not None and said in why


def test_a_rollout_under_way_is_left_to_finish() -> None:
    moving = deployment()
    moving["status"].update(replicas=2, updatedReplicas=1)
    assert make_before_break(moving) == "a rollout of it is under way"
    unseen = deployment()
    unseen["metadata"]["generation"] = 4  # the Deployment controller has not seen the last change yet
    assert make_before_break(unseen) == "a rollout of it is under way"


def test_the_patch_writes_only_the_template_annotation_guarded_by_the_version() -> None:
    now = datetime(2026, 12, 4, 18, 0, 5, tzinfo=timezone.utc)
    assert rollout_patch(deployment(), now) == {
        "metadata": {"resourceVersion": "42"},
        "spec": {"template": {"metadata": {"annotations": {RESIZED_AT_ANNOTATION: "2026-12-04T18:00:05Z"}}}}}
