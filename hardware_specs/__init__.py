"""GPU hardware specs: one YAML per GPU, loaded into `GpuSpec`."""
from hardware_specs.spec import GpuSpec, SpecError, available, detect, load, resolve, sm_slice

__all__ = ["GpuSpec", "SpecError", "available", "detect", "load", "resolve", "sm_slice"]
