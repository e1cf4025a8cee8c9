"""The analytic time model: the physics it claims, and a fit that recovers its own predictions."""
import random

import torch

import hardware_specs
from graphs import GemmProblem
from gnn_policy.measure.simulator import AnalyticModel, fit
from gnn_policy.space import space, violations

H200 = hardware_specs.load("h200")
BIG = GemmProblem(8192, 8192, 8192)
TILE = space("full").at((3, 3, 2, 0, 2, 1, 2, 1))  # 128x128x64, SPLIT_K 1, 4 warps, 3 stages, TMA


def test_a_compute_bound_gemm_slows_with_fewer_sms_a_tiny_one_barely():
    model = AnalyticModel()
    half = hardware_specs.load("h200-sm64")
    full_ms, half_ms = model.predict_ms([(BIG, TILE, H200), (BIG, TILE, half)]).tolist()
    assert 1.8 < half_ms / full_ms < 2.2
    tiny = GemmProblem(16, 256, 256)
    t_full, t_half = model.predict_ms([(tiny, TILE, H200), (tiny, TILE, half)]).tolist()
    assert t_half / t_full < 1.1


def test_one_program_past_a_full_wave_costs_a_wave():
    model = AnalyticModel()
    deep = space("full").at((3, 3, 2, 0, 2, 1, 5, 1))  # 6 stages: 192 KiB of shared memory, one per SM
    fits = GemmProblem(128 * 12, 128 * 11, 4096)  # 132 tiles: one wave on 132 SMs
    spills = GemmProblem(128 * 12 + 1, 128 * 11, 4096)  # 143 tiles: a second wave
    a, b = model.predict_ms([(fits, deep, H200), (spills, deep, H200)]).tolist()
    assert b > 1.7 * a


def test_fit_recovers_the_predictions_of_a_known_model():
    rng = random.Random(0)
    truth = AnalyticModel(tile_half=3000.0, efficiency=0.6, iter_us=1.0, launch_us=3.0, bandwidth=0.7,
                          l2_miss=0.2, splitk_us=4.0, tma_gain=1.3, warp_gain=1.5)
    valid = [c for c in space("full") if not violations(c, H200, "bf16")]
    rows = []
    for _ in range(400):
        p = GemmProblem(rng.choice((1, 16, 128, 1024, 4096)), rng.choice((768, 4096, 14336)), rng.choice((768, 4096)))
        c = rng.choice(valid)
        if c.split_k * c.block_k <= p.k:
            rows.append((p, c, H200))
    target = truth.predict_ms(rows)
    fitted = fit(rows, target.tolist(), steps=800)
    err = (fitted.predict_ms(rows) / target).log().abs()
    assert torch.median(err) < 0.05


def test_a_larger_l2_never_costs_memory_time():
    import dataclasses

    model = AnalyticModel(l2_miss=0.1)
    p = GemmProblem(2048, 2048, 2048)
    small = dataclasses.replace(H200, name="small-l2", l2_bytes=2**20)
    slow, fast = model.predict_ms([(p, TILE, small), (p, TILE, H200)]).tolist()
    assert fast <= slow
