"""Tests run kernels through Triton's interpreter unless a CUDA GPU is present.

TRITON_INTERPRET must be set before any @triton.jit decorator runs, i.e. before gnn_policy
is imported, which is why it is set here at collection time.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
