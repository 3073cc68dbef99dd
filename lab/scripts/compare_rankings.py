#!/usr/bin/env python3
"""How much two ranking files agree: per task (and model-wide), the mean and
minimum over layers of the Jaccard overlap of the top 20% and top 70% neurons.
Usage: lab/scripts/compare_rankings.py A.ranking.safetensors B.ranking.safetensors
(plain Python: reads the safetensors header and the u32 `order.*` tensors).
"""
import json, struct, array, sys
def load(p):
    b=open(p,'rb').read(); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n]); base=8+n; out={}
    for k,v in h.items():
        if k.startswith('order.'):
            s,e=v['data_offsets']; a=array.array('I'); a.frombytes(b[base+s:base+e]); L,N=v['shape']
            out[k[6:]]=[a[i*N:(i+1)*N] for i in range(L)]
    return out
A=load(sys.argv[1]); B=load(sys.argv[2])
for frac in (0.2,0.7):
  for t in sorted(A):
    js=[]
    for la,lb in zip(A[t],B[t]):
        k=int(frac*len(la)); x=set(la[:k]); y=set(lb[:k]); js.append(len(x&y)/len(x|y))
    print(f"top {frac:.0%} {t}: mean Jaccard {sum(js)/len(js):.3f} (min {min(js):.3f})")
