"""Dump favourite_rows (the calibration's rows) for h100,h200 once, with problem keys."""
import pickle, torch, hardware_specs
from gnn_policy.database import Database
from gnn_policy.policy import Policy
from gnn_policy.benchmarks.calibrate import favourite_rows
torch.set_num_threads(1)
pol = Policy.load("checkpoints/pretrained.pt")
with Database('/tmp/ev.sqlite') as db:
    rows = [r for g in ("h100", "h200") for r in favourite_rows(pol, db, hardware_specs.load(g), 8)]
pickle.dump(rows, open('/tmp/sat/rows.pkl', 'wb'))
print(len(rows))
