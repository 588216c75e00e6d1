"""What each pod uses of the node's GPUs (issue 35, item 1).

``sampler`` reads NVML's per-process utilisation samples each poll (the only part that
calls the backend); ``attribution`` turns one poll into per-pod, per-container use (pure).
The agent exports the result as Prometheus metrics (``node.metrics``).
"""
