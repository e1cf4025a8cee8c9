import math, statistics, collections, torch, sys
import hardware_specs
from gnn_policy.database import Database
from gnn_policy.policy import Policy
from gnn_policy.space import TileConfig
from gnn_policy.measure.result import CUBLAS
from gnn_policy.calibration import roofline_tflops
from gnn_policy.cost_features import leading_dims
from graphs.classes import split_of, ROLES
torch.set_num_threads(2)
pol = Policy.load(sys.argv[1] if len(sys.argv)>1 else "checkpoints/pretrained.pt")
space = pol.model.space
def hand(p, gpu):
    al, bl = leading_dims(p)
    f=[math.log(p.m), math.log(p.n), math.log(p.k), math.log(p.batch), p.a_layout=="col", p.b_layout=="col",
       p.dtype=="bf16", p.bias, p.activation is not None, p.residual]
    for lead in (al, bl, p.n):
        f += [lead%8==0, lead%16==0, lead%2==0, lead%64==0]
    for d in (p.m,p.n,p.k): f += [d%16==0, d%128==0]
    rf=roofline_tflops(p,gpu,floor=False); rb=roofline_tflops(p,gpu)
    f += [math.log(rf), math.log(rb), math.log(p.flops/p.bytes_min()), gpu.name.startswith("H100")]
    return [float(x) for x in f]
data=[]
with Database('/tmp/ev.sqlite') as db:
  for g in ("h100","h200"):
    gpu = hardware_specs.load(g)
    for problem in db.problems(gpu.name):
        sp = split_of(problem)
        if sp == "other": continue
        measured = {TileConfig.from_key(k): tf for k, tf in db.tflops(gpu.name, problem.key).items() if k != CUBLAS}
        configs=[c for c in measured if c in space]
        if not configs: continue
        with torch.no_grad():
            h,_=pol.encode(problem,gpu); idx=torch.tensor([space.index(c) for c in configs])[None]
            pred=pol.cost(h,problem,gpu,idx)[0].exp().tolist()
        best=sorted(zip(pred,configs),key=lambda x:-x[0])[:8]
        rows=[(math.log(p), math.log(measured[c])) for p,c in best]
        data.append(dict(gpu=g, split=sp, h=h[0].tolist(), f=hand(problem,gpu), rows=rows, bound=math.log(roofline_tflops(problem,gpu))))
torch.save(data, '/tmp/offset_data.pt')
print(len(data))
