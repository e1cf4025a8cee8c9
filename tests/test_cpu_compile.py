"""benchmarks.cpu_compile: compiling for sm_90 on the CPU finds the TMA copies whose buffer is not
the size of their tensor map's box (the hang of `warpspec` with host-side maps), and the
template's warp-specialised kernels, now with maps made in the kernel, have none."""
import json
import os
import subprocess
import sys

from gnn_policy.benchmarks.cpu_compile import tma_box_mismatches

HOST_MAP = ("ttng.async_tma_copy_global_to_local %a_desc[%a_17, %k0] %62, %61, %true : "
            "!tt.tensordesc<tensor<128x64xbf16, #shared>>, !ttg.memdesc<1xi64, #shared1, #smem, mutable> -> "
            "!ttg.memdesc<64x64xbf16, #shared, #smem, mutable> loc(#loc)")
DEVICE_MAP = HOST_MAP.replace("tensor<128x64xbf16", "tensor<64x64xbf16")
B_MAP = ("ttng.async_tma_copy_global_to_local %b_desc[%b_29, %b] %66, %65, %true : "
         "!tt.tensordesc<tensor<64x128xbf16, #shared>>, !ttg.memdesc<1xi64, #shared1, #smem, mutable> -> "
         "!ttg.memdesc<64x128xbf16, #shared, #smem, mutable>")


def test_a_box_copied_into_a_smaller_buffer_is_found():
    assert tma_box_mismatches("\n".join([HOST_MAP, B_MAP, "ttng.barrier_expect %61, 8192"])) == ["128x64 -> 64x64"]
    assert tma_box_mismatches("\n".join([DEVICE_MAP, B_MAP])) == []


def test_the_warp_specialised_kernels_compile_for_sm90_with_boxes_that_fit(tmp_path):
    # the H100's hang (2x1000x1000x1000, B column-major, bm128_bn64_bk64 w4 s3) and a row-major B
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile, not the interpreter
    out = tmp_path / "cc.jsonl"
    subprocess.run([sys.executable, "-m", "gnn_policy.benchmarks.cpu_compile",
                    "--problem", "2x1000x1000x1000_bf16_rc", "--problem", "1x1000x1000x1000_bf16_rr",
                    "--config", "bm128_bn64_bk64_sk1_gm8_w4_s3_warpspec",
                    "--config", "bm128_bn128_bk64_sk1_gm8_w4_s4_warpspec", "--out", str(out)],
                   check=True, env=env, capture_output=True, timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert row["status"] == "ok", row
        assert "warps=12" in row["error"]  # specialised: a producer and two consumer warp groups
