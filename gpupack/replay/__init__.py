"""``gpupack replay``: an openb trace through the real stack on KWOK nodes, beside the simulator (docs/replay.md).

Modules: ``mapping`` (trace rows as Nodes and pods), ``stack`` (the control plane, agents, webhook and
controller), ``runner`` (submitting one pod at a time), ``outcome`` (bound or never placed, from the pod),
``figures``, ``costs``, ``progress``, ``report`` and ``priority`` (``--priority qos``: openb's classes as
PriorityClasses, pods preempted live, figures per class).
"""
