"""The host-overhead script runs off the GPU and reports every row it names."""
import re

from gnn_policy.benchmarks.host_overhead import main


def test_it_times_matmuls_python_and_each_variants_prepare(capsys):
    main(["--shape", "8x64x64", "--calls", "3", "--repeats", "1"])
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^  (.+?)\s+([\d.]+) us$", out, re.M))
    assert set(rows) == {"matmul (launch stood in)", "prepare ptr", "prepare tma", "prepare persistent"}
    assert all(float(v) > 0 for v in rows.values())
