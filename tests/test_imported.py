"""The imported vLLM / SGLang configs (data/tuned_configs, shipped in the repo) as demonstrations,
and the imitation loss that trains the policy on them."""
import csv
import json
import math
from collections import Counter, defaultdict

import pytest
import torch

import hardware_specs
from gnn_policy.model import ModelConfig, PolicyModel
from gnn_policy.space import TileConfig, space
from hardware_specs.features import GpuVocab
from training.dataset import collate, demonstration_samples
from training.imported import TUNED_CONFIGS, load_demonstrations, name_fields
from training.losses import imitation_loss

FULL = space("full")
H100_TP2 = "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"


@pytest.fixture(scope="module")
def shipped():
    return load_demonstrations()


def test_file_names_parse_as_the_index_says():
    rows = list(csv.DictReader((TUNED_CONFIGS / "index.csv").open()))
    files = sorted(TUNED_CONFIGS.rglob("*.json"))
    assert len(rows) == len(files) == 895
    by_path = {r["path"].replace("vllm_configs/", "vllm/", 1).replace("sglang_configs/", "sglang/", 1): r
               for r in rows}
    for path in files:
        row, fields = by_path[str(path.relative_to(TUNED_CONFIGS))], name_fields(path)
        assert (fields.get("E", ""), fields.get("N", ""), fields.get("K", "")) == (row["E"], row["N"], row["K"])
        assert fields["device_name"] == row["device"] and fields["down"] == (row["down_proj_only"] == "True")
        assert fields.get("dtype", "fp16/bf16") == row["dtype"]


def test_duplicates_are_read_once(shipped):
    """Against a count made here: files of one name (spacing aside) whose M entries are equal dicts."""
    groups = defaultdict(list)
    for path in TUNED_CONFIGS.rglob("*.json"):
        entries = {m: e for m, e in json.loads(path.read_text()).items() if isinstance(e, dict)}
        groups[path.name.replace(" ", "")].append(entries)
    distinct = 0
    for contents in groups.values():
        kept = []
        for entries in contents:
            if all(entries != k for k in kept):
                kept.append(entries)
        distinct += len(kept)
    _, report = shipped
    assert report.files == 895 and report.files - report.duplicates == distinct == 727
    # Four files carry the H100 TP-2 name: three identical, one retuned (SGLang, triton 3.3.1).
    demos, _ = shipped
    assert len(list(TUNED_CONFIGS.rglob(H100_TP2))) == 4
    assert len({d.origin for d in demos if d.origin.endswith(H100_TP2)}) == 2


def test_counts_on_the_shipped_files(shipped):
    demos, report = shipped
    assert sum(report.skipped["dtype"].values()) == 479 and report.skipped["dtype"]["fp8_w8a8"] == 397
    assert sum(report.skipped["gpu"].values()) == 55 and report.skipped["gpu"]["NVIDIA_A800-SXM4-80GB"] == 8
    assert sum(report.skipped["model"].values()) == 177
    assert report.demonstrations == {"MI300X": 288, "H100-SXM5-80GB": 144, "A100-SXM4-80GB": 108, "L40S": 38}
    assert (report.exact, report.mapped, sum(report.dropped.values())) == (392, 186, 0) and len(demos) == 578
    assert report.mapped_why["group_m 64->16"] == 66
    assert Counter(d.exact for d in demos) == {True: 392, False: 186}


def test_mixtral_shapes_by_hand(shipped):
    """Mixtral-8x7B: hidden 4096, intermediate 14336, 8 experts, top-2."""
    demos, _ = shipped
    tp1 = {(d.m_key, d.problem.layer): d for d in demos
           if d.origin == "vllm/fused_moe/E=8,N=14336,device_name=AMD_Instinct_MI300X.json"}
    up, down = tp1[(4096, "fused_moe up TP1")], tp1[(4096, "fused_moe down TP1")]
    # 4096 tokens x top-2 = 8192 rows over 8 experts: 1024 rows each.
    assert (up.problem.batch, up.problem.m, up.problem.n, up.problem.k) == (8, 1024, 2 * 14336, 4096)
    assert (down.problem.batch, down.problem.m, down.problem.n, down.problem.k) == (8, 1024, 4096, 14336)
    assert up.problem.b_layout == "col" and up.problem.model == "Mixtral-8x7B" and up.gpu == "MI300X"
    assert up.config == TileConfig(128, 128, 64, 1, 1, 8, 2) and up.exact  # AMD's kpack etc. aside
    one = tp1[(1, "fused_moe up TP1")].problem  # one token: two experts with one row each
    assert (one.batch, one.m) == (2, 1)
    tp8 = [d.problem for d in demos if d.origin.endswith("/E=8,N=1792,device_name=NVIDIA_A100-SXM4-80GB.json")]
    assert {(p.n, p.k) for p in tp8} == {(3584, 4096), (4096, 1792)}


def test_every_config_is_valid_for_its_gpu_and_problem(shipped):
    demos, _ = shipped
    for d in demos:
        assert d.config in FULL
        assert FULL.problem_mask(hardware_specs.load(d.gpu), d.problem)[FULL.index(d.config)], d


def _write(root, rel, entries):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries))


def _entry(bm=64, bn=64, bk=64, group=8, warps=4, stages=3):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
            "num_warps": warps, "num_stages": stages}


def test_rules_on_a_made_up_folder(tmp_path):
    name = "E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3.json"
    _write(tmp_path, f"vllm/fused_moe/{name}", {"16": _entry()})
    _write(tmp_path, f"sglang/fused_moe/triton_3_1_0/{name}", {"16": _entry()})  # a duplicate
    _write(tmp_path, f"sglang/fused_moe/triton_3_2_0/{name}", {"16": _entry(group=64)})  # same name, retuned
    _write(tmp_path, "sglang/fused_moe/triton_3_2_0/E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3_down.json",
           {"16": _entry(bm=32)})
    _write(tmp_path, "vllm/fused_moe/E=8,N=3584,device_name=NVIDIA_H999.json", {"16": _entry()})
    _write(tmp_path, "vllm/fused_moe/E=8,N=3584,device_name=NVIDIA_L40S.json",
           {"16": _entry(bm=128, bn=128, stages=4), "32": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16,
                                                            "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}})
    _write(tmp_path, "vllm/fused_moe/E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
           {"16": _entry()})
    demos, report = load_demonstrations(tmp_path)
    assert report.files == 7 and report.duplicates == 1
    assert report.skipped["gpu"] == {"NVIDIA_H999": 1} and report.skipped["dtype"] == {"fp8_w8a8": 1}
    by_origin = defaultdict(list)
    for d in demos:
        by_origin[d.origin].append(d)
    assert {d.problem.layer for d in by_origin[f"sglang/fused_moe/triton_3_1_0/{name}"]} == {
        "fused_moe up TP4", "fused_moe down TP4"}  # no _down file beside it: one config for both
    retuned = by_origin[f"sglang/fused_moe/triton_3_2_0/{name}"]
    assert [d.problem.layer for d in retuned] == ["fused_moe up TP4"]  # its _down file tunes the down GEMM
    assert retuned[0].config.group_m == 16 and not retuned[0].exact
    down = by_origin["sglang/fused_moe/triton_3_2_0/E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3_down.json"]
    assert [(d.problem.layer, d.config.block_m) for d in down] == [("fused_moe down TP4", 32)]
    # On the L40S (99 KiB per block) four 128x128x64 bf16 stages need 128 KiB: three fit.
    l40s = by_origin["vllm/fused_moe/E=8,N=3584,device_name=NVIDIA_L40S.json"]
    assert {d.config.num_stages for d in l40s} == {3} and report.mapped_why["num_stages 4->3 (smem)"] == 2
    assert report.dropped == {"missing num_warps/num_stages": 2}


def test_a_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tuned-configs folder at .*nowhere"):
        load_demonstrations(tmp_path / "nowhere")


def test_imitation_loss_falls_when_training_on_one_demonstration(shipped):
    demo = next(d for d in shipped[0] if d.gpu == "H100-SXM5-80GB")
    batch = collate(demonstration_samples([demo], FULL), FULL, GpuVocab([demo.gpu]))
    torch.manual_seed(0)
    model = PolicyModel(ModelConfig(hidden=16, layers=1, gpu_names=(demo.gpu,), gpu_dropout=0.0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        logp = model.log_prob(model.encode(batch.graphs, batch.spec, batch.gpu_index), batch.configs, batch.masks)
        loss = imitation_loss(logp, batch.valid)
        assert loss.item() == pytest.approx(-logp[0, 0].item())  # the NLL of the one demonstrated config
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    # From about the uniform NLL over the valid configs down to a fraction of it.
    assert losses[0] > 0.5 * math.log(FULL.problem_mask(hardware_specs.load(demo.gpu), demo.problem).sum().item())
    assert losses[-1] < 0.5 * losses[0]
