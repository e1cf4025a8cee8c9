"""fit_analytic on rows of several GPUs: one fit, figures per GPU, a clear error for a GPU without rows;
random problems are fitted on or checked on by their split."""
import json

import pytest

from gnn_policy.benchmarks.fit_analytic import main
from gnn_policy.collect import CollectArgs, run as collect
from gnn_policy.measure.simulator import fitted_gpus, load_fitted


def test_one_fit_over_two_gpus_reports_each(tmp_path, monkeypatch):
    monkeypatch.setattr("gnn_policy.benchmarks.fit_analytic.load_shipped", lambda db: 0)  # fake rows only
    db = str(tmp_path / "m.sqlite")
    for gpu in ("h200", "h200-sm64"):
        collect(CollectArgs(db=db, gpu=gpu, split="all", problems=12, configs=8, lists=False,
                            runner="fake_runner:measure"))
    out = tmp_path / "analytic.json"
    main(["--db", db, "--gpu", "h200,h200-sm64", "--out", str(out)])
    report = json.loads(out.read_text())
    assert fitted_gpus(out) == ["H200-SXM-141GB", "H200-SXM-141GB-sm64"]
    assert set(report["per_gpu_val_and_test"]) == set(report["gpus"])
    assert report["train"]["rows"] > 0 and load_fitted(out).efficiency > 0
    with pytest.raises(SystemExit, match="no correct real Triton rows for H200-SXM-141GB-sm16"):
        main(["--db", db, "--gpu", "h200,h200-sm16"])
    # fitted on the slice alone, checked on every H200 row
    main(["--db", db, "--gpu", "h200-sm64", "--held-out-gpu", "h200", "--out", str(out)])
    report = json.loads(out.read_text())
    assert fitted_gpus(out) == ["H200-SXM-141GB-sm64"]
    assert report["held_out_gpu"]["gpu"] == "H200-SXM-141GB" and report["held_out_gpu"]["problems"] == 12
    with pytest.raises(SystemExit, match="also in --gpu"):
        main(["--db", db, "--gpu", "h200,h200-sm64", "--held-out-gpu", "h200"])


def test_random_problems_are_fitted_on_or_checked_on_by_their_split(tmp_path, monkeypatch):
    monkeypatch.setattr("gnn_policy.benchmarks.fit_analytic.load_shipped", lambda db: 0)  # fake rows only
    db = str(tmp_path / "m.sqlite")
    for split, count in (("train", 4), ("random-train", 2), ("random-test", 1)):
        collect(CollectArgs(db=db, gpu="h200", split=split, problems=count, configs=8, lists=False,
                            runner="fake_runner:measure"))
    out = tmp_path / "analytic.json"
    main(["--db", db, "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["train"]["problems"] == 6 and report["val_and_test"]["problems"] == 1
