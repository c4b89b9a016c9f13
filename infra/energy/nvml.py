"""GPU energy from NVML's per-device energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
millijoules since the driver loaded; Volta and newer), through ``nvidia-ml-py`` where it is
installed (``pip install shardflow[gpu-energy]``). Without the package, the driver or a GPU,
:func:`open_devices` returns nothing and nothing here is ever imported again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Devices:
    """NVML handles of the chosen devices; :meth:`read_mj` is their counters."""

    def __init__(self, nvml: Any, handles: list[Any], indices: list[int]) -> None:
        self._nvml, self._handles, self.indices = nvml, handles, indices

    def read_mj(self) -> dict[int, int]:
        return {i: int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h))
                for i, h in zip(self.indices, self._handles, strict=True)}


def open_devices(indices: Sequence[int] | None = None) -> Devices | None:
    """The devices ``indices`` (NVML's numbering; all when None), or None when NVML, a GPU or
    its energy counter is missing."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        wanted = list(range(count)) if indices is None else [i for i in indices if i < count]
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in wanted]
        devices = Devices(pynvml, handles, wanted)
        if not handles:
            return None
        devices.read_mj()  # pre-Volta GPUs have no energy counter: NVMLError here
        return devices
    except Exception:  # noqa: BLE001 - pynvml.NVMLError and its many subclasses
        return None
