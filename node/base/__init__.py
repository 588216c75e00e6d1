"""What the node agent's parts share, below every one of them.

The parts (``node.layouts``, ``node.advertising``, ``node.health``) and the DRA
kubelet plugin (``node.draplugin``) import these; the agent at ``node/``'s root
wires the parts together and is imported by none of them:

- ``context``: the protocol the parts act on the agent through, and the types it
  carries: ``settings``, ``kube`` (the agent's Kubernetes calls), ``snapshot``
  (with ``dcgm``'s activity), ``pods``, ``journal`` (the reconfiguration record),
  ``conditions``, ``idle_tracking`` (the agent's idle clocks) and ``reshape_rules``
  (the SharingPolicies selecting the node, as the agent asks the reshape gate);
- what two parts speak alike: ``operator_mode`` (the GPU Operator's mig-manager
  and device-plugin configs) and ``device_plugin_emulator`` (SIMULATION).
"""
