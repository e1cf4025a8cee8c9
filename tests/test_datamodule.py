"""The pretraining DataModule on a hand-made database holding every split: train and val take the
suite and the random problems of their role, no loader holds a test problem of either kind, the
named lists' rows of random problems are weighted like the suite's, and an empty train role is
a clear error."""
import random

import pytest

import hardware_specs
from graphs import GemmProblem
from graphs.random_gemms import problems
from graphs.suite import split
from gnn_policy.database import Database
from gnn_policy.measure.result import Measurement
from gnn_policy.search import valid_configs
from gnn_policy.space import NAMED_LISTS, space
from hardware_specs.features import GpuVocab
from training.datamodule import MeasurementDataModule, share_key, thin_configs
from training.dataset import NAMED_KEYS, load_samples
from training.imported import Demonstration

H200 = hardware_specs.load("h200")
FULL = space("full")
NAMED_WEIGHT = 0.25
SAMPLED = 4  # configs of no named list per problem
# a few problems of every split graphs.classes.split_of names, "other" (a tuned shape) included
PROBLEMS = {
    "train": [p for p in split("train") if p.dtype == "bf16"][:2],
    "val": [p for p in split("val") if p.dtype == "bf16"][:1],
    "test": [p for p in split("test") if p.dtype == "bf16"][:1],
    "random-train": problems("random-train", 2),
    "random-val": problems("random-val", 1),
    "random-test": problems("random-test", 2),
    "other": [GemmProblem(100, 1000, 1000)],
}


def keys_of(*splits: str) -> set[str]:
    return {p.key for s in splits for p in PROBLEMS[s]}


def split_rows(path, gpu=H200, splits=tuple(PROBLEMS)) -> dict[str, int]:
    """Made-up correct rows of the problems of `splits` on `gpu`: SAMPLED configs of no named list
    and two of the tutorial's, as `collect` measures the lists on every problem. Returns the
    named rows per problem key."""
    rng = random.Random(0)
    named_rows = {}
    with Database(path) as db:
        for p in (p for s in splits for p in PROBLEMS[s]):
            valid = valid_configs(FULL, gpu, p)
            named = [c for c in NAMED_LISTS["triton_tutorial"] if c in valid][:2]
            assert named, f"{p.key}: no valid tutorial config; pick another problem"
            configs = rng.sample([c for c in valid if c.key not in NAMED_KEYS], SAMPLED) + named
            db.add((Measurement(gpu.name, p.key, c.key, "ok", median_ms=1.0, tflops=10 + 90 * rng.random()), p, c)
                   for c in configs)
            named_rows[p.key] = len(named)
    return named_rows


def _data(path, demos=(), **kwargs) -> MeasurementDataModule:
    data = MeasurementDataModule(str(path), [H200.name], FULL, GpuVocab([H200.name, "A100-SXM4-80GB"]),
                                 batch_size=3, load_snapshot=False, demos=demos, named_weight=NAMED_WEIGHT,
                                 **kwargs)
    data.setup()
    return data


def _demo(p: GemmProblem) -> Demonstration:
    return Demonstration("A100-SXM4-80GB", p, NAMED_LISTS["triton_tutorial"][0], "made-up.json", p.m, True)


def test_train_and_val_take_both_kinds_and_no_loader_holds_a_test_problem(tmp_path):
    split_rows(tmp_path / "m.sqlite")
    data = _data(tmp_path / "m.sqlite", demos=[_demo(PROBLEMS["train"][0]), _demo(PROBLEMS["test"][0])])
    keys = {role: {s.problem.key for s in samples} for role, samples in data.samples.items()}
    assert keys == {"train": keys_of("train", "random-train"), "val": keys_of("val", "random-val"),
                    "test": keys_of("test", "random-test")}
    train = data.train_dataloader()
    loaders = [train["measured"], train["imported"], data.val_dataloader()]
    loaded = {s.problem.key for loader in loaders for s in loader.dataset}
    assert loaded == keys_of("train", "random-train", "val", "random-val")  # "other" is in no role either
    # the test family's demonstration is left out
    assert {s.problem.key for s in train["imported"].dataset} == {PROBLEMS["train"][0].key}
    assert sum(len(b.valid) for b in train["measured"]) == len(data.samples["train"])  # batches are those samples


def test_random_rows_of_the_named_lists_weigh_named_weight(tmp_path):
    named_rows = split_rows(tmp_path / "m.sqlite")
    data = _data(tmp_path / "m.sqlite")
    by_key = {s.problem.key: s for s in data.samples["train"]}
    for p in PROBLEMS["random-train"] + PROBLEMS["train"]:
        weights = by_key[p.key].weights.tolist()
        assert sorted(weights) == [NAMED_WEIGHT] * named_rows[p.key] + [1.0] * SAMPLED


def test_samples_of_chosen_splits_and_unknown_split_names(tmp_path):
    split_rows(tmp_path / "m.sqlite")
    with Database(tmp_path / "m.sqlite") as db:
        random_only = load_samples(db, [H200.name], FULL, ("random-train",))
        assert {s.problem.key for s in random_only} == keys_of("random-train")
        with pytest.raises(KeyError, match="unknown split Llama-3-8B"):  # a family is not a split
            load_samples(db, [H200.name], FULL, ("Llama-3-8B",))


def test_no_training_problem_names_both_sources_and_the_gpus(tmp_path):
    split_rows(tmp_path / "m.sqlite", splits=("val", "test", "random-val", "random-test"))
    with pytest.raises(ValueError, match=r"no training problems measured on H200-SXM-141GB: none of the train "
                                         r"families \(Llama-3-8B, .*\) and none of random-train"):
        _data(tmp_path / "m.sqlite")


def test_train_share_keeps_the_same_problems_and_train_on_val_adds_val(tmp_path):
    split_rows(tmp_path / "m.sqlite")
    train = keys_of("train", "random-train")
    kept = {k for k in train if share_key(k) < 0.5}
    assert 0 < len(kept) < len(train), "pick a share that splits these problems"
    for _ in range(2):  # the same problems every time: a hash of the key, not a random draw
        half = _data(tmp_path / "m.sqlite", train_share=0.5)
        assert {s.problem.key for s in half.samples["train"]} == kept
        assert {s.problem.key for s in half.samples["val"]} == keys_of("val", "random-val")
    both = _data(tmp_path / "m.sqlite", train_on_val=True)
    assert {s.problem.key for s in both.samples["train"]} == train | keys_of("val", "random-val")
    assert not {s.problem.key for s in both.samples["train"]} & keys_of("test", "random-test")
    with pytest.raises(ValueError, match=r"train_share must be in \(0, 1\], got 1.5"):
        _data(tmp_path / "m.sqlite", train_share=1.5)


def test_train_config_share_thins_every_training_problem_the_same_way_and_leaves_val_whole(tmp_path):
    split_rows(tmp_path / "m.sqlite")
    full = _data(tmp_path / "m.sqlite")
    rows = {s.problem.key: s for s in full.samples["train"]}
    half, again = (_data(tmp_path / "m.sqlite", train_config_share=0.5) for _ in range(2))
    assert {s.problem.key for s in half.samples["train"]} == set(rows)  # every problem stays
    for s in half.samples["train"]:
        whole = rows[s.problem.key]
        assert len(s.configs) == round(len(whole.configs) / 2)
        # the kept rows are rows of the problem, each with its own TFLOP/s and weight
        pairs = {tuple(c.tolist()): (t.item(), w.item())
                 for c, t, w in zip(whole.configs, whole.log_tflops, whole.weights)}
        assert all(pairs[tuple(c.tolist())] == (t.item(), w.item())
                   for c, t, w in zip(s.configs, s.log_tflops, s.weights))
    # the same rows every time: a hash of problem and config, not a random draw
    assert [s.configs.tolist() for s in half.samples["train"]] == [s.configs.tolist() for s in again.samples["train"]]
    assert [len(s.configs) for s in half.samples["val"]] == [len(s.configs) for s in full.samples["val"]]
    with pytest.raises(ValueError, match=r"train_config_share must be in \(0, 1\], got 0"):
        _data(tmp_path / "m.sqlite", train_config_share=0)


def test_thin_configs_keeps_at_least_one_config_and_thins_the_failures_alike():
    import torch
    from training.dataset import Sample

    p = GemmProblem(64, 256, 256)
    sample = Sample(problem=p, gpu=H200.name, graph=None, configs=torch.arange(30).reshape(10, 3),
                    log_tflops=torch.arange(10.0), failed=torch.arange(12).reshape(4, 3) + 100,
                    weights=torch.ones(10))
    tenth = thin_configs(sample, 0.01)
    assert len(tenth.configs) == 1 and len(tenth.failed) == 0
    half = thin_configs(sample, 0.5)
    assert len(half.configs) == 5 and len(half.failed) == 2 and half.failed.shape[1] == 3
    assert set(map(tuple, half.failed.tolist())) <= set(map(tuple, sample.failed.tolist()))
    assert thin_configs(sample, 1.0).configs.tolist() == sample.configs.tolist()
