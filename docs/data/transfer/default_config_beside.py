"""`default_config`'s first pick beside transfer's figures: geomean over a transfer report's
problems of its TFLOP/s over the best stored (`class_report.record`'s rule; a pick with no stored
row is left out and counted).

    python docs/data/transfer/default_config_beside.py DB OUT_FOLDER GPU
"""
import csv
import math
import sys

import hardware_specs
from gnn_policy.benchmarks.class_report import record
from gnn_policy.database import Database
from graphs import GemmProblem

db_path, folder, gpu_name = sys.argv[1:4]
gpu = hardware_specs.load(gpu_name)
keys = list(dict.fromkeys(r["problem"] for r in csv.DictReader(open(f"{folder}/transfer.csv"))))
with Database(db_path, readonly=True) as db:
    got = [record(GemmProblem.from_key(k), db.tflops(gpu.name, k), gpu).fractions["default_config"] for k in keys]
ok = [v for v in got if v]
print(f"{gpu.name}: default_config {math.exp(sum(map(math.log, ok)) / len(ok)):.3f} over {len(ok)} of "
      f"{len(keys)} problems (the rest: its pick has no stored row)")
