"""The one Kubernetes edge the components share (it imports nothing else of gpupack).

- ``kube.errors``: what a Kubernetes API failure means (:class:`KubeError`: conflict,
  invalid, not found), so the controller and the node agent agree on it; each keeps
  its own small client wrapper for the calls it makes (``controller/kube.py``,
  ``node/kube.py``).
- ``kube.times``: ``metav1.Time`` and ``MicroTime``, written and read one way.
- ``kube.conditions``: ``metav1.Condition`` bookkeeping (``lastTransitionTime``).
"""

from kube.errors import KubeError, from_api_exception

__all__ = ["KubeError", "from_api_exception"]
