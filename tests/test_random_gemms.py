"""The random GEMM generator: seeded, distributed as documented, split by a stable hash."""
import random
from collections import Counter

import pytest

from graphs import GemmProblem
from graphs.classes import ALL_SPLITS, CLASSES, ROLES, classes, split_of
from graphs.random_gemms import (BYTES_CAP, EPILOGUES, FLOP_CAP, MODEL, SPLITS, draw, problems,
                                 split_of_shape)
from graphs.suite import suite


@pytest.fixture(scope="module")
def draws():
    rng = random.Random(11)
    return [draw(rng) for _ in range(4000)]


def _share(ps, pred):
    return sum(map(pred, ps)) / len(ps)


def test_a_seed_gives_the_same_problems_and_another_seed_others():
    assert problems("random-train", 50, seed=3) == problems("random-train", 50, seed=3)
    assert problems("random-train", 50, seed=3) != problems("random-train", 50, seed=4)
    assert problems("random-val", 40)[:25] == problems("random-val", 25)  # a larger count extends a smaller


def test_distribution_matches_the_docstring(draws):
    ms = [p.m for p in draws]
    assert min(ms) >= 1 and max(ms) <= 16384 and min(p.n for p in draws) >= 16 and max(p.k for p in draws) <= 65536
    assert 0.2 < _share(draws, lambda p: p.m % 2) < 0.35  # arbitrary M: about half odd, after the caps
    assert 0.38 < _share(draws, lambda p: p.m <= 64) < 0.55
    for dim in ("n", "k"):
        size = lambda p: getattr(p, dim)  # noqa: E731
        assert 0.35 < _share(draws, lambda p: size(p) % 128 == 0 or size(p) < 128 and size(p) % 16 == 0) < 0.6
        assert 0.2 < _share(draws, lambda p: size(p) % 8 == 0 and size(p) % 16 != 0) < 0.33
        assert 0.2 < _share(draws, lambda p: size(p) % 2 == 1) < 0.33
    assert 0.45 < _share(draws, lambda p: p.b_layout == "col") < 0.55
    assert 0.1 < _share(draws, lambda p: p.a_layout == "col") < 0.2
    assert 0.06 < _share(draws, lambda p: p.batch > 1) < 0.12
    assert max(p.batch for p in draws) <= 128
    assert 0.45 < _share(draws, lambda p: p.dtype == "fp16") < 0.55
    assert {(p.bias, p.activation, p.residual) for p in draws} == {e[:3] for e in EPILOGUES}
    assert all(p.model == MODEL for p in draws)


def test_every_draw_is_within_the_caps(draws):
    assert max(p.flops for p in draws) <= FLOP_CAP and max(p.bytes_min() for p in draws) <= BYTES_CAP
    assert max(max(p.batch * p.m * p.k, p.batch * p.k * p.n, p.batch * p.m * p.n) for p in draws) < 2**31
    assert max(p.flops for p in draws) > FLOP_CAP / 10  # the cap binds, it does not shrink everything


def test_the_epilogues_are_the_suites():
    mix = Counter((p.bias, p.activation, p.residual) for ps in suite().values() for p in ps)
    assert {e[:3]: e[3] for e in EPILOGUES} == dict(mix)


def test_splits_are_stable_disjoint_and_proportioned(draws):
    p = GemmProblem(77, 1000, 333, b_layout="col", dtype="fp16", model=MODEL)
    assert split_of_shape(p) == "random-train"  # pinned: a sha256, not Python's salted hash
    shares = Counter(split_of_shape(p) for p in draws)
    assert 0.76 < shares["random-train"] / len(draws) < 0.84 and 0.07 < shares["random-test"] / len(draws) < 0.13
    keys = {s: {q.key for q in problems(s, 60)} for s in SPLITS}
    assert not keys["random-train"] & keys["random-val"] and not keys["random-val"] & keys["random-test"]
    shapes = {s: {q.key.split("_")[0] + q.key.split("_")[2] for q in problems(s, 60)} for s in SPLITS}
    assert not shapes["random-train"] & shapes["random-test"]  # the fp16 / bf16 twins stay together
    suite_keys = {q.key for ps in suite().values() for q in ps}
    assert not suite_keys & keys["random-test"]
    assert all(split_of(q) == s for s in SPLITS for q in problems(s, 20))


def test_every_class_is_populated(draws):
    seen = Counter(c for p in draws for c in classes(p))
    assert set(seen) == set(CLASSES) and min(seen.values()) >= 100
    assert classes(GemmProblem(16, 4096, 4096)) == ("decode",)
    assert classes(GemmProblem(8192, 128, 200, batch=4, b_layout="col")) == (
        "prefill", "skinny", "short K", "unaligned", "column-major B", "batched")


def test_stored_problems_find_their_split():
    assert split_of(GemmProblem(16, 4096, 4096, model="Qwen2-7B")) == "test"
    assert split_of(GemmProblem(16, 4096, 4096, model="Llama-3-70B-TP8")) == "val"
    assert split_of(GemmProblem(16, 4096, 4096)) == "other"
    assert ALL_SPLITS[:3] == ("train", "val", "test") and ALL_SPLITS[-1] == "other"


def test_every_split_but_other_has_one_role():
    named = [s for splits in ROLES.values() for s in splits]
    assert sorted(named) == sorted(ALL_SPLITS[:-1])  # each once: no split is both trained on and held out
    assert all(role in splits and f"random-{role}" in splits for role, splits in ROLES.items())


def test_unknown_split_and_endless_count_are_refused():
    with pytest.raises(KeyError, match="random-train"):
        problems("random", 5)
    with pytest.raises(ValueError, match="number of problems"):
        problems("random-test", 0)
