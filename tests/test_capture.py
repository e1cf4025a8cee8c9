"""graphs.capture on a small transformer block defined here."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from graphs.capture import capture


class Block(nn.Module):
    """Pre-norm attention + GELU MLP, written the way models write them."""

    def __init__(self, d=64, heads=4, hidden=256):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.reshape(b * self.heads, t, d // self.heads)
        k = k.reshape(b * self.heads, t, d // self.heads)
        v = v.reshape(b * self.heads, t, d // self.heads)
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d // self.heads), dim=-1)
        y = torch.bmm(att, v).reshape(b, t, d)
        x = x + self.proj(y)
        return self.fc2(self.act(self.fc1(self.ln2(x)))) + x


def test_captures_the_gemms_and_their_epilogues():
    found = {g.problem.layer: g for g in capture(Block(), (torch.randn(2, 10, 64),))}
    qkv, proj, fc1, fc2 = found["qkv"].problem, found["proj"].problem, found["fc1"].problem, found["fc2"].problem
    assert (qkv.m, qkv.n, qkv.k, qkv.bias, qkv.activation, qkv.residual) == (20, 192, 64, True, None, False)
    assert proj.residual and proj.bias and proj.activation is None
    assert (fc1.n, fc1.k, fc1.activation) == (256, 64, "gelu")
    assert (fc2.n, fc2.k, fc2.bias, fc2.residual) == (64, 256, False, True)
    bmms = [g.problem for g in found.values() if g.problem.layer.startswith("bmm")]
    assert sorted((p.batch, p.m, p.n, p.k) for p in bmms) == [(8, 10, 10, 16), (8, 10, 16, 10)]
    assert found["qkv"].producers == ("LayerNorm",)
    assert found["fc1"].consumers == ("Linear",)  # through the folded GELU, into fc2


def test_functional_forms_and_dtypes():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(32, 16))

        def forward(self, x, r):
            return F.silu(F.linear(x, self.w)) + r, torch.addmm(r, x @ self.w.t(), torch.eye(32))

    found = capture(M(), (torch.randn(4, 16), torch.randn(4, 32)))
    lin = next(g.problem for g in found if "linear" in g.problem.layer)
    assert (lin.m, lin.n, lin.k, lin.activation, lin.residual, lin.dtype) == (4, 32, 16, "silu", True, "fp32")
    assert any(g.problem.bias and "addmm" in g.problem.layer for g in found)


def test_layouts_tanh_gelu_and_what_cannot_run():
    from graphs.capture import capture_model

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 32)
            self.conv = nn.Conv1d(4, 4, 3)
            self.w = nn.Parameter(torch.randn(8, 32))

        def forward(self, x, y):
            h = F.gelu(self.fc(x), approximate="tanh")  # not the template's exact GELU: not folded
            return torch.matmul(h, self.w.t()), self.conv(y), torch.matmul(x.double(), x.double().t())

    found, skipped = capture_model(M(), (torch.randn(4, 16), torch.randn(1, 4, 8)))
    fc = next(g.problem for g in found if g.problem.layer == "fc")
    assert (fc.a_layout, fc.b_layout, fc.activation) == ("row", "col", None)
    mm = next(g.problem for g in found if g.problem.n == 8)
    assert (mm.a_layout, mm.b_layout) == ("row", "col")  # w.t() is a column-major view
    assert len(found) == 2  # the float64 GEMM is listed as skipped, not labelled fp32
    assert [s[0] for s in skipped] == ["conv", "matmul_1"]
    assert "Conv1d" in skipped[0][1] and "float64" in skipped[1][1]
