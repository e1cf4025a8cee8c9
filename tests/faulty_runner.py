"""A measuring function for GPU worker tests: real kernels, and real Triton kernels that fault or hang.

Configs with BLOCK_M 32 launch a kernel that stores far outside any allocation (an illegal
address: the CUDA context is lost), BLOCK_M 128 one that spins on a flag nobody sets; the
others go to the real runner.
"""
import torch
import triton
import triton.language as tl

from gnn_policy.measure.runner import measure_configs


@triton.jit
def _store_out_of_bounds(ptr):
    tl.store(ptr + (1 << 40), 1.0)


@triton.jit
def _spin(flag_ptr):
    while tl.load(flag_ptr, volatile=True) == 0:
        pass


def measure(problem, configs, *, gpu, **options):
    for config in configs:
        if config is not None and config.block_m in (32, 128):
            buf = torch.zeros(16, device="cuda", dtype=torch.int32 if config.block_m == 128 else torch.float32)
            (_spin if config.block_m == 128 else _store_out_of_bounds)[(1,)](buf)
            torch.cuda.synchronize()  # raises on the fault; never returns from the spin
        yield from measure_configs(problem, [config], gpu=gpu, **options)
