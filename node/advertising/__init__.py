"""How the node's GPUs are advertised to the kubelet: one seam, three implementations.

- :class:`~node.advertising.stock.StockDevicePlugin`: the GPU Operator's NVIDIA
  device plugin (every real node): sharing config in its ConfigMap, paused and
  restarted around a reshape.
- :class:`~node.advertising.emulated.EmulatedDevicePlugin`: the agent plays the
  plugin on a simulated node (``--emulate-device-plugin``).
- :class:`~node.advertising.dra.DraPublisher`: no device plugin; the agent
  publishes the node's DRA ResourceSlices (``--backend dra``).

The agent picks one when it starts (:func:`advertiser_for`) and its loop never
asks which; the protocol is ``node.base.context.Advertiser``.
"""

from __future__ import annotations

from node.advertising.dra import DraPublisher
from node.advertising.emulated import EmulatedDevicePlugin
from node.advertising.stock import StockDevicePlugin
from node.base.context import Advertiser
from node.base.settings import AgentSettings

__all__ = ["Advertiser", "DraPublisher", "EmulatedDevicePlugin", "StockDevicePlugin", "advertiser_for"]


def advertiser_for(settings: AgentSettings) -> Advertiser:
    """ResourceSlices on the ``dra`` backend; else the emulator when the settings ask for it
    (simulated nodes), else the stock plugin."""
    if settings.backend == "dra":
        return DraPublisher(settings)
    return EmulatedDevicePlugin() if settings.emulate_device_plugin else StockDevicePlugin()
