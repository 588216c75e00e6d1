"""gpupack's Dynamic Resource Allocation device model (driver ``gpu.gpupack.io``).

Pure builders from gpupack's own models (``mig`` and ``sharing``) to the
ResourceSlices a node publishes under ``resource.k8s.io/v1``, and a validator
for them. No Kubernetes client here: the node agent publishes what these
functions return (docs/dra.md).

Modules:

* ``names``: the driver, attribute, capacity, counter, device and slice names;
  DeviceClass names and selectors;
* ``limits``: the API's per-object limits (k8s.io/api v0.37.2);
* ``model``: frozen value types of counter sets, devices, capacities, slices;
* ``share_policy``: the request policy of shared GPUs (the one reading of the share unit);
* ``mig_devices``: a MIG-capable GPU in dynamic mode as partitionable devices;
* ``gpu_devices``: a shared GPU (MPS, time-slicing) and a whole GPU;
* ``slices``: one node's devices split into the ResourceSlices of its pool;
* ``validate``: the pure checks of what gpupack would publish;
* ``wire``: to and from the API's JSON shapes; the DeviceClasses;
* ``claims``: the pod's side: the ResourceClaimTemplate a pod's gpupack requests become
  on a DRA pool, and the check of a user's own claims against gpupack's DeviceClasses.
"""
