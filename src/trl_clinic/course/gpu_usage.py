"""How busy the GPU was while a lesson ran: peak memory and mean utilisation, sampled from outside.

A lesson trains in its kernel and, for 02b and 05, in child processes; NVML (the ``nvidia-ml-py``
package, ``pynvml``, present on GPU machines) sees all of them, so the runner samples the device itself
instead of asking each process. Without NVML or a GPU the numbers are absent and ``why`` says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import ModuleType


@dataclass
class GpuUsage:
    """Samples of one GPU taken every ``interval_s`` between ``start()`` and ``stop()``."""

    index: int = 0
    interval_s: float = 0.5
    memory_mib: list[float] = field(default_factory=list)
    utilisation_pct: list[float] = field(default_factory=list)
    why: str = ""  # why nothing was sampled, when nothing was

    def start(self) -> GpuUsage:
        nvml = _nvml()
        if isinstance(nvml, str):
            self.why = nvml
            return self
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(nvml,), daemon=True)
        self._thread.start()
        return self

    def _sample(self, nvml: ModuleType) -> None:
        handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
        while True:
            self.memory_mib.append(nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20)
            self.utilisation_pct.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> dict[str, float | str | None]:
        """``peak_gpu_memory_mib`` and ``mean_gpu_utilisation_pct`` over the samples (None without any)."""
        if hasattr(self, "_thread"):
            self._stop.set()
            self._thread.join()
        sampled = bool(self.memory_mib)
        return {
            "peak_gpu_memory_mib": round(max(self.memory_mib), 1) if sampled else None,
            "mean_gpu_utilisation_pct": round(sum(self.utilisation_pct) / len(self.utilisation_pct), 1)
            if sampled
            else None,
            "gpu_samples": len(self.memory_mib),
            **({} if sampled else {"gpu_usage_missing": self.why or "no sample was taken"}),
        }


def _nvml() -> ModuleType | str:
    """The initialised ``pynvml`` module, or why it cannot be used here."""
    try:
        import pynvml
    except ImportError:
        return "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return "NVML sees no GPU"
    except pynvml.NVMLError as error:
        return f"NVML is not usable here: {error}"
    return pynvml
