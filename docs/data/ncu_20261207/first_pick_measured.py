"""Where the default's own first pick (`Policy.top_k` over the whole space) is measured on H100 random-test.

    python docs/data/ncu_20261207/first_pick_measured.py   (/tmp/ev.sqlite: any database; the shipped snapshot is loaded)
"""
import math

import hardware_specs
from graphs.classes import split_of
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.policy import Policy
from gnn_policy.snapshot import load_shipped

gpu = hardware_specs.load("h100")
policy = Policy.load("checkpoints/pretrained.pt")
with Database("/tmp/ev.sqlite") as db:
    load_shipped(db)
    problems = measured = top8 = 0
    fractions = []
    for p in db.problems(gpu.name):
        if split_of(p) != "random-test":
            continue
        tf = db.tflops(gpu.name, p.key)
        tf.pop(CUBLAS, None)
        picks = [x.config.key for x in policy.top_k(p, gpu, 8)]
        problems += 1
        top8 += sum(k in tf for k in picks)
        if picks[0] in tf:
            measured += 1
            fractions.append(tf[picks[0]] / max(tf.values()))
    print(f"{problems} problems; first pick measured on {measured}, top 8 on {top8} of {8 * problems}; "
          f"first pick / best known where measured {math.exp(sum(map(math.log, fractions)) / len(fractions)):.4f}")
