"""Tests run kernels through Triton's interpreter unless a CUDA GPU is present.

TRITON_INTERPRET must be set before any @triton.jit decorator runs, i.e. before gnn_policy
is imported, which is why it is set here at collection time.
"""
import os
import shutil
import tempfile

import pytest
import torch

# Tests build their own databases: the shipped snapshot stays out unless a test asks for it
# (tests/test_shipped_data.py). Set before gnn_policy is imported, and inherited by the CLI
# subprocesses.
os.environ["GNN_POLICY_SHARDS"] = tempfile.mkdtemp(prefix="gnn-policy-no-shards-")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(os.environ["GNN_POLICY_SHARDS"], ignore_errors=True)


if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture()
def ckpt(tmp_path):
    """A small untrained policy that knows the H200: the start of the fine-tune tests."""
    import dataclasses

    import hardware_specs
    from gnn_policy.model import ModelConfig, PolicyModel

    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(hardware_specs.load("h200").name,)))
    path = tmp_path / "start.pt"
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
    return path
