"""How many SMs a green context of N SMs really runs kernels on (GPU).

    python -m gnn_policy.benchmarks.slice_sms --counts 16,33,48,64,66,72,96,100

The driver rounds a requested count up to its partition granularity; this prints, per
count, the SMs that `sms_reached` finds kernels on, as a markdown table.
"""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    import torch

    from gnn_policy.measure.slices import green_stream, sms_reached

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="16,33,48,64,66,72,96,100", help="SM counts to ask for, comma-separated")
    counts = [int(c) for c in ap.parse_args(argv).counts.split(",")]
    reached = [sms_reached(green_stream(n, torch.cuda.current_device())) for n in counts]
    full = sms_reached(torch.cuda.Stream())
    print("| SMs asked for | " + " | ".join(map(str, counts)) + " | full GPU |")
    print("|---|" + "---|" * (len(counts) + 1))
    print("| SMs reached | " + " | ".join(map(str, reached)) + f" | {full} |")


if __name__ == "__main__":
    main()
