"""The one Kubernetes edge the components share: what a Kubernetes API failure means.

The controller (``controller/kube.py``) and the node agent (``node/kube.py``) each keep
their own small client wrapper for the calls they make, and read API failures through
:class:`KubeError` here, so both agree on what is a conflict and what is missing.
"""

from kube.errors import KubeError, from_api_exception

__all__ = ["KubeError", "from_api_exception"]
