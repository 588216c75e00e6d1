"""The ``resource.k8s.io/v1`` limits gpupack's slices must respect, as Kubernetes v1.37 sets them.

Source: ``k8s.io/api@v0.37.2/resource/v1/types.go`` (the constants named in
each docstring) and the API server's validation of ResourceSlices
(``k8s.io/kubernetes@v1.37.2/pkg/apis/resource/validation``). The validator
(``sharing.dra.validate``) checks them before anything is published, so a
slice the API server would refuse is caught with a message naming the limit.
"""

from __future__ import annotations

from typing import Final

MAX_DEVICES: Final = 128
"""``ResourceSliceMaxDevices``: devices in one slice."""
MAX_DEVICES_ADVANCED: Final = 64
"""``ResourceSliceMaxDevicesWithAdvancedFeatures``: devices in one slice when any of them
consumes counters (or has taints, or list attributes)."""
MAX_COUNTER_SETS: Final = 8
"""``ResourceSliceMaxCounterSets``: counter sets in one slice."""
MAX_COUNTERS_PER_SET: Final = 32
"""``ResourceSliceMaxCountersPerCounterSet``."""
MAX_CONSUMPTIONS_PER_DEVICE: Final = 2
"""``ResourceSliceMaxDeviceCounterConsumptionsPerDevice``: counter sets one device consumes from."""
MAX_COUNTERS_PER_CONSUMPTION: Final = 32
"""``ResourceSliceMaxCountersPerDeviceCounterConsumption``."""
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
"""``ResourceSliceMaxAttributesAndCapacitiesPerDevice``: attributes plus capacities of one device."""
MAX_ATTRIBUTE_VALUE_LENGTH: Final = 64
"""``DeviceAttributeMaxValueLength``: characters of a string attribute."""
MAX_DRIVER_NAME: Final = 63
"""``DriverNameMaxLength``; the driver is also a DNS subdomain."""
MAX_DOMAIN: Final = 63
"""``DeviceMaxDomainLength``: the domain of a qualified attribute or capacity name."""
MAX_ID: Final = 32
"""``DeviceMaxIDLength``: the C identifier of a qualified attribute or capacity name."""
MAX_POOL_NAME: Final = 253
"""``PoolNameMaxLength`` (a node name's limit)."""
MAX_LABEL: Final = 63
"""A DNS label (device, counter set and counter names)."""
MAX_SUBDOMAIN: Final = 253
"""A DNS subdomain (object names, node names)."""
