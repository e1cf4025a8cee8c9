"""gnn_policy.matmul without a config: the policy's top-1, cached per problem (interpreter)."""
import pytest
import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy import ops
from gnn_policy.kernels.reference import reference, relative_error
from gnn_policy.policy import Policy
from gnn_policy.space import violations


@pytest.fixture
def fresh_caches():
    ops._policy.cache_clear()
    ops.policy_config.cache_clear()
    yield
    ops._policy.cache_clear()
    ops.policy_config.cache_clear()


def test_no_config_runs_the_policys_top1_and_caches_it(fresh_caches):
    gpu = hardware_specs.load("h200")
    a = torch.randn(24, 48, dtype=torch.float16)
    b = torch.randn(40, 48, dtype=torch.float16).t()  # column-major B, as a linear layer's weight
    bias = torch.randn(40, dtype=torch.float16)
    out = ops.matmul(a, b, bias=bias, activation="gelu")
    assert relative_error(out, reference(a, b, bias=bias, activation="gelu")) < 1e-2
    problem = GemmProblem(24, 40, 48, dtype="fp16", b_layout="col", bias=True, activation="gelu")
    assert ops.policy_config.cache_info().currsize == 1
    chosen = ops.policy_config(problem, gpu, None)  # a cache hit: matmul asked this, for no named checkpoint
    assert ops.policy_config.cache_info().hits == 1
    assert chosen == Policy.load().top_k(problem, gpu, 1)[0].config
    assert not violations(chosen, gpu, "fp16", 48)


def test_fp32_and_a_missing_checkpoint_take_the_default(fresh_caches, monkeypatch):
    gpu = hardware_specs.load("h200")
    assert ops.policy_config(GemmProblem(8, 16, 32, dtype="fp32"), gpu) is None
    monkeypatch.setenv("GNN_POLICY_CHECKPOINT", "/nonexistent/policy.pt")
    a, b = torch.randn(8, 32, dtype=torch.float16), torch.randn(32, 16, dtype=torch.float16)
    with pytest.warns(UserWarning, match=r"no policy checkpoint at /nonexistent/policy.pt.*using the default configs") as seen:
        out = ops.matmul(a, b)
    assert seen[0].filename == __file__  # the warning names the caller's line, not the package's
    assert ops.policy_config(GemmProblem(8, 16, 32, dtype="fp16"), gpu) is None
    assert relative_error(out, reference(a, b)) < 1e-2
