"""The GPU's SM clock, read beside each timing: a sustained GEMM sweep can pull the clock down
(power and thermal limits), and a timing is only comparable with others at the same clock.

Reads NVML through nvidia-ml-py when it is installed (it is on the GPU machine); returns None
otherwise, so the harness runs unchanged where NVML is missing.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def _handle(index: int):
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:
        return None


def sm_clock_mhz(index: int = 0) -> int | None:
    """Current SM clock of GPU `index` in MHz, or None if NVML is unavailable."""
    handle = _handle(index)
    if handle is None:
        return None
    import pynvml

    return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
