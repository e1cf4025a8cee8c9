import torch, statistics, math
from graphs.classes import ROLES
data=torch.load('/tmp/offset_data.pt')
train=[d for d in data if d['split'] in ROLES['train']]
def target(d): return statistics.mean(m-p for p,m in d['rows'])
def err(ds, off):
    e=[]
    for d,o in zip(ds,off):
        for p,m in d['rows']: e.append(abs(min(p+o, d['bound'])-m))
    return statistics.median(e), sum(x<math.log(1.2) for x in e)/len(e)
def X(ds, kind):
    cols=[]
    for d in ds:
        v=[]
        if 'h' in kind: v+=d['h']
        if 'f' in kind: v+=d['f']
        cols.append(v+[1.0])
    return torch.tensor(cols,dtype=torch.float64)
y=torch.tensor([target(d) for d in train],dtype=torch.float64)
for kind in ('none','f','h','hf'):
    for lam in ([0] if kind=='none' else [0.1,1,10]):
        if kind=='none': w=None
        else:
            A=X(train,kind); mu=A[:,:-1].mean(0); sd=A[:,:-1].std(0)+1e-6
            An=torch.cat([(A[:,:-1]-mu)/sd, A[:,-1:]],1)
            w=torch.linalg.solve(An.T@An+lam*torch.eye(An.shape[1],dtype=torch.float64), An.T@y)
        out=[]
        for name,sp in (('train',ROLES['train']),('val',ROLES['val']),('test',ROLES['test'])):
            for g in ('h100','h200'):
                ds=[d for d in data if d['split'] in sp and d['gpu']==g]
                if not ds: continue
                if w is None: off=[0.0]*len(ds)
                else:
                    B=X(ds,kind); Bn=torch.cat([(B[:,:-1]-mu)/sd,B[:,-1:]],1); off=(Bn@w).tolist()
                m,s=err(ds,off); out.append(f"{name}/{g} {m:.3f} ({s:.0%}) n={len(ds)}")
        print(kind,lam,' | '.join(out))
