"""gpupack's packing engine: cluster state, node-scoring policies and the decision loop.

Shared by the trace simulator (``sharing.simulator``) and the live controller:
build a ``ClusterState`` from nodes, call ``decide``/``schedule`` with a
``Policy`` from ``make_policy``.
"""
