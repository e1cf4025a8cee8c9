"""GPU spec vectors and the known-GPU vocabulary."""
import math

import torch

import hardware_specs
from hardware_specs.features import SPEC_DIM, GpuVocab, spec_vector


def test_every_spec_gives_a_finite_vector_on_one_scale():
    vectors = torch.stack([spec_vector(hardware_specs.load(n)) for n in hardware_specs.available()])
    assert vectors.shape == (len(hardware_specs.available()), SPEC_DIM)
    assert torch.isfinite(vectors).all() and vectors.min() >= 0 and vectors.max() < 1.1


def test_a_slice_differs_in_sm_count_and_peaks_only():
    full, part = spec_vector(hardware_specs.load("h200")), spec_vector(hardware_specs.load("h200-sm64"))
    changed = set(torch.nonzero(full != part).flatten().tolist())
    assert changed == {0, 8, 9, 10, 11, 12, 17}  # SMs, the five peaks, the ridge point
    assert torch.isclose(full[0] - part[0], torch.tensor(math.log2(132 / 64) / 8))  # log2 of the SM count / 8


def test_vocab_maps_unknown_gpus_to_zero():
    vocab = GpuVocab(["H200-SXM-141GB", "A100-SXM4-80GB", "H200-SXM-141GB"])
    assert len(vocab) == 3 and vocab.index("A100-SXM4-80GB") == 1 and vocab.index("H200-SXM-141GB") == 2
    assert vocab.index("B200") == 0
