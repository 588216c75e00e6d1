"""gpupack's DRA kubelet plugin (driver ``gpu.gpupack.io``): the gRPC server the kubelet calls.

The kubelet finds the plugin through its registration socket (``registration``)
and then calls ``NodePrepareResources`` / ``NodeUnprepareResources`` on the
plugin's own socket (``service``). Preparing a claim creates the MIG instance it
was allocated, records the MPS limits of a GPU share, and writes a CDI spec the
container runtime applies; unpreparing undoes that (``prepare``). Every step is
written ahead to a journal file per claim (``journal``), so a plugin killed at
any point finishes or rolls back on its next start.

Modules, one concept each:

| module | role |
| --- | --- |
| ``devices`` | device names (``gpu-0-mig-1g-10gb-6``) parsed back into GPU, profile, placement (pure) |
| ``claims`` | the allocation of a ResourceClaim as typed values; the ``ClaimSource`` protocol (pure) |
| ``kube_claims`` | ``KubeClaimSource``: reads ResourceClaims from the API server |
| ``file_claims`` | ``FileClaimSource``: reads them from a file (simulation, tests) |
| ``mps`` | a share's MPS limits and their environment variables (pure) |
| ``cdi`` | CDI spec content (pure) and its atomic writing |
| ``journal`` | per-claim write-ahead records, and what a restart does with each (pure decisions) |
| ``files`` | atomic, fsynced writes and removals (journal, CDI specs) |
| ``plan`` | a claim's allocation checked against the node and NVML: what preparing it means (no changes) |
| ``prepare`` | ``ClaimPreparer``: prepare, unprepare, recover; NVML through ``node.nvml.protocol`` |
| ``service`` | the two gRPC servicers (DRA v1, plugin registration) |
| ``server`` | both unix sockets, start and clean shutdown |
| ``client`` | the kubelet's side of the API (tests, ``gpupack dra-plugin call``) |
| ``settings`` | ``PluginSettings``: one documented group, ``GPUPACK_DRA_*`` variables |
"""
