import torch, statistics, math
from graphs.classes import ROLES
data=torch.load('/tmp/offset_data.pt')
# rows: (log pred, log meas); need log R (no floor). bound has floor. recompute R? approximate: f[-4] is log rf
def rows(ds, kind):
    X=[];Y=[];meta=[]
    for d in ds:
        lr=d['f'][-4]
        for p,m in d['rows']:
            v=[p-lr]
            if 'f' in kind: v+=d['f']
            if 'h' in kind: v+=d['h']
            if 'g' in kind: v+=[d['gpu']=='h100']
            X.append(v+[1.0]); Y.append(m-lr); meta.append((lr,d['bound'],m))
    return torch.tensor(X,dtype=torch.float64), torch.tensor(Y,dtype=torch.float64), meta
def evaluate(w,mu,sd,ds,kind):
    X,Y,meta=rows(ds,kind); Xn=torch.cat([(X[:,:-1]-mu)/sd,X[:,-1:]],1); yh=(Xn@w).tolist()
    e=[abs(min(lr+min(0,y),b)-m) for y,(lr,b,m) in zip(yh,meta)]
    return statistics.median(e), sum(x<math.log(1.2) for x in e)/len(e)
def fit(g, pooled, kind, lam):
    """Ridge on the training role's rows (one GPU's, or both with a GPU feature when pooled)."""
    tr=[d for d in data if d['split'] in ROLES['train'] and (pooled or d['gpu']==g)]
    k=kind+('g' if pooled else '')
    X,Y,_=rows(tr,k); mu=X[:,:-1].mean(0); sd=X[:,:-1].std(0)+1e-6; mu[0]=0; sd[0]=1
    Xn=torch.cat([(X[:,:-1]-mu)/sd,X[:,-1:]],1)
    reg=lam*torch.eye(Xn.shape[1],dtype=torch.float64); reg[0,0]=0; reg[-1,-1]=0
    return torch.linalg.solve(Xn.T@Xn+reg, Xn.T@Y), mu, sd, k
for pooled in (False,True):
  for kind in ('','f','fh'):
    for lam in (1.0,30.0):
      out=[]
      for g in ('h100','h200'):
        w,mu,sd,k=fit(g,pooled,kind,lam)
        for name in ('val','test'):
            ds=[d for d in data if d['split'] in ROLES[name] and d['gpu']==g]
            m,s=evaluate(w,mu,sd,ds,k); out.append(f"{name}/{g} {m:.3f} ({s:.0%})")
      print('pooled' if pooled else 'perGPU', kind or 'linear', lam, ' | '.join(out))
print('--- per split')
for pooled in (False,True):
  for kind in ('','f','fh'):
    out=[]
    for g in ('h100','h200'):
        w,mu,sd,k=fit(g,pooled,kind,30.0)
        for name in sorted({d['split'] for d in data if d['gpu']==g} - set(ROLES['train'])):
            ds=[d for d in data if d['split']==name and d['gpu']==g]
            m,s=evaluate(w,mu,sd,ds,k); out.append(f"{name}/{g} {m:.3f}")
    print('pooled' if pooled else 'perGPU', kind or 'linear', ' | '.join(out))
