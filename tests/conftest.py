"""Tests run kernels through Triton's interpreter unless a CUDA GPU is present.

TRITON_INTERPRET must be set before any @triton.jit decorator runs, i.e. before gnn_policy
is imported, which is why it is set here at collection time.
"""
import os
import shutil
import tempfile

import torch

# Tests build their own databases: the shipped snapshot stays out unless a test asks for it
# (tests/test_shipped_data.py). Set before gnn_policy is imported, and inherited by the CLI
# subprocesses.
os.environ["GNN_POLICY_SHARDS"] = tempfile.mkdtemp(prefix="gnn-policy-no-shards-")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(os.environ["GNN_POLICY_SHARDS"], ignore_errors=True)


if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
