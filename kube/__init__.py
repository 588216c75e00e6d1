"""The one Kubernetes edge the components share (it imports nothing else of gpupack).

- ``kube.client``: credentials (:func:`~kube.client.api_client`), error translation,
  retries of idempotent calls on transient failures, and Events, in
  :class:`~kube.client.KubeClient`; each component subclasses it with the calls
  it makes (``controller/kube.py``, ``node/base/kube.py``) and the webhook's watch
  loads its credentials through it.
- ``kube.errors``: what a Kubernetes API failure means (:class:`KubeError`: conflict,
  invalid, not found), so the components agree on it.
- ``kube.settings``: environment variables read one way.
- ``kube.times``: ``metav1.Time`` and ``MicroTime``, written and read one way.
- ``kube.conditions``: ``metav1.Condition`` bookkeeping (``lastTransitionTime``).
"""

from kube.errors import KubeError, from_api_exception

__all__ = ["KubeError", "from_api_exception"]
