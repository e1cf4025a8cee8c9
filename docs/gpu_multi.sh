#!/bin/bash
# One device call on a machine of several GPUs (device time counts per machine, not per GPU):
#     BUDGET=585 bash docs/gpu_multi.sh gputests wstrial wsprobe
# GPU 0 runs docs/gpu_session.sh with the stages given (the kernel work); the other GPUs collect
# $SPLIT (default random-train, its first $PROBLEMS, default 2500) under torchrun, one rank a
# GPU, each rank its hash share of the problems and its own shard (gnn_policy/distributed.py).
# On one GPU it is gpu_session.sh with `collect` added. One tar of everything: $OUT/results.tgz,
# GPU 0's files under g0/, the ranks' shards under t/ (move them to data/measurements/).
set -u
START=$(date +%s); BUDGET=${BUDGET:-570}; SPLIT=${SPLIT:-random-train}; PROBLEMS=${PROBLEMS:-2500}
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$NGPU" -lt 2 ]; then case " $* " in *" collect "*) exec bash docs/gpu_session.sh "$@";;
                                          *) exec bash docs/gpu_session.sh "$@" collect;; esac; fi
R=/tmp/multi; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpus.txt
CUDA_VISIBLE_DEVICES=0 SESSION_DIR=$R/g0 NO_TAR=1 BUDGET=$(( BUDGET - 10 )) bash docs/gpu_session.sh "$@" > $R/g0.log 2>&1 &
G0=$!
L=$(( BUDGET - 30 ))
# the ranks share the host's cores for compiling; tqdm's bars of 7 ranks in one log would bury it
CUDA_VISIBLE_DEVICES=$(seq -s, 1 $(( NGPU - 1 ))) TQDM_DISABLE=1 timeout $L python3 -m torch.distributed.run \
  --nproc-per-node $(( NGPU - 1 )) -m gnn_policy.cli collect --db /tmp/rm.sqlite --split $SPLIT --problems $PROBLEMS \
  --configs 100 --pool 100 --pool-by-class --space hopper-tested --named triton_tutorial --named inductor_mm \
  --policy checkpoints/pretrained.pt --policy-top 4 \
  --time-limit $(python3 -c "print(round(($L - 60) / 60, 2))") --timeout 10 --compile-timeout 60 \
  --shard-dir $R/t > $R/collect.log 2>&1
echo "collect rc $?" >> $R/collect.log
wait $G0; echo "GPU 0's stages rc $?" >> $R/g0.log
echo "== tar at $(( $(date +%s) - START )) s"
tar czf $OUT/results.tgz -C $R .
