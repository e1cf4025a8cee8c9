"""First pick among the measured configs of a split, per problem (what offline_eval's `new_by_score` scores).

    python docs/data/trainval_20261207/first_pick.py CHECKPOINT GPU SPLIT OUT.json   (/tmp/ev.sqlite: the shipped snapshot)

Prints the geomean of (measured TFLOP/s of the best-scored measured config) / best measured; writes per problem
the pick, the best config and their predicted and measured TFLOP/s.
"""
import json, math, sys, collections, torch
import hardware_specs
from graphs.classes import classes, split_of
from gnn_policy.baselines import fits
from gnn_policy.database import Database
from gnn_policy.measure.result import CUBLAS
from gnn_policy.policy import Policy
from gnn_policy.space import TileConfig
gpu = hardware_specs.load(sys.argv[2]); split = sys.argv[3]
pol = Policy.load(sys.argv[1])
rows = []
with Database("/tmp/ev.sqlite") as db:
    for p in [p for p in db.problems(gpu.name) if split_of(p) == split]:
        tf = db.tflops(gpu.name, p.key); cub = tf.pop(CUBLAS, None)
        ok = fits(pol.model.space, gpu, p)
        configs = [c for c in map(TileConfig.from_key, tf) if c in pol.model.space and ok(c)]
        if not configs: continue
        vals = [tf[c.key] for c in configs]
        s = pol.scores(p, gpu)
        pred = s.by_flat[torch.tensor([pol.model.space.flat_index(c) for c in configs])]
        i = int(pred.argmax()); b = max(range(len(vals)), key=lambda j: vals[j])
        best_all = max(tf.values())
        rows.append(dict(p=p.key, cls=classes(p), frac=vals[i]/best_all, pick=configs[i].key, best=configs[b].key,
                         pick_pred=math.exp(pred[i]), pick_meas=vals[i], best_pred=math.exp(pred[b]), best_meas=vals[b],
                         n=len(configs), cub=cub))
json.dump(rows, open(sys.argv[4], "w"))
g = lambda v: math.exp(sum(map(math.log, v))/len(v))
print(len(rows), "first pick", round(g([r['frac'] for r in rows]), 4))
