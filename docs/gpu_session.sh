#!/bin/bash
# One device call of the open GPU work, as the `device` tool runs it from the repository root:
#     BUDGET=570 bash docs/gpu_session.sh ceiling200 ncu picks collect
# Stages run in the order given, each under a timeout, so that one tar of everything is always
# written to $OUT/results.tgz (a call returns at most 8 files): BUDGET seconds in all, 20 kept for
# the tar. Stages: gputests (`pytest -m gpu` but the warpspec trial), ceiling200 (issue 18's ceiling, on an H200 only), ncu (streamk against tma on
# 1000^3 and 256x4544x4544), picks (the default's top 8 on the H100's random-test, an H100 only),
# e2e and adapter (issue 21's benchmarks), e2eplan (eager and patch alone, afresh), plantests (the launch
# plans' GPU tests), host (host time of a call, launcher alone, a plan's call, and a profile), wsprobe (warp specialisation with device-side tensor maps),
# wstrial (the warpspec variant's GPU correctness trial with its hang rule lifted; it stops after
# two hangs), wsceiling (its ceiling on the first 15 shapes, only after a trial without a hung or
# failed case, in this call or the one before on the same warm machine), collect
# (random-train, resumes from the shipped shards), slices (random-train on SM slices sm64, sm32, sm96 and sm16
# of the GPU that came, $SLICES to choose, 800 problems x 50 configs, at most 100 GFLOP), sweep200 (the H200's random-test split swept
# densely, resuming: 1,000 configs a problem, then refinement and confirm; an H200 only), sweep48 (issue 22's
# held-out slice: the first 40 random-test problems swept densely on 48 SMs of whichever GPU came, resuming),
# serve48 (issue 22's Done-when: transfer's served method on sm48's test problems at B = 0 and 64; an H200 only).
# Shards come back under c/, s/ and t/ in the tar: move them to docs/data/ceiling/ or data/measurements/.
set -u
export TQDM_DISABLE=1  # progress bars of a scripted call only bloat its logs (a collect's ran to 100 KB)
START=$(date +%s); BUDGET=${BUDGET:-570}
R=${SESSION_DIR:-/tmp/res}; rm -rf "$R"; mkdir -p "$R"  # docs/gpu_multi.sh runs it on GPU 0 into its own, with NO_TAR
left() { echo $(( BUDGET - ($(date +%s) - START) - 20 )); }
mins() { python3 -c "print(round(max($1, 30) / 60, 2))"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/gpu.txt
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
for stage in "$@"; do
  L=$(left); [ "$L" -lt 45 ] && { echo "skip $stage: $L s left"; continue; }
  echo "== $stage at $(( $(date +%s) - START )) s, $L s left"
  case $stage in
    gputests)
      GNN_POLICY_GPU_REPORT=$R/gpucases.json timeout $(( L < 280 ? L : 280 )) python3 -m pytest -m gpu -v \
        -p no:cacheprovider tests/ -k "not warpspec_trial" --durations=10 > $R/gputests.log 2>&1 ;;
    ceiling200)
      case "$GPU" in *H200*) ;; *) echo "not an H200: no ceiling"; continue;; esac
      timeout $L python3 -m gnn_policy.benchmarks.ceiling --db /tmp/c.sqlite --load docs/data/ceiling --configs 24 \
        --named triton_tutorial --named inductor_mm --refine-top 2 --variant ptr --variant tma --variant subtile \
        --variant streamk --variant persistent --time-limit $(mins $(( L - 40 < 360 ? L - 40 : 360 ))) --timeout 10 --shard-dir $R/c \
        --json $R/ceiling.json --markdown $R/ceiling.md > $R/ceiling.log 2>&1 ;;
    ncu)
      timeout $(( L < 150 ? L : 150 )) ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 -m gnn_policy.benchmarks.profile_launch \
        1x1000x1000x1000_bf16_rr:bm128_bn128_bk64_sk1_gm8_w4_s4_tma \
        1x1000x1000x1000_bf16_rr:bm64_bn128_bk128_sk1_gm4_w4_s3_streamk \
        1x256x4544x4544_bf16_rc:bm128_bn128_bk64_sk1_gm8_w4_s6_tma \
        1x256x4544x4544_bf16_rc:bm128_bn128_bk64_sk1_gm4_w4_s6_streamk > $R/ncu.log 2>&1 ;;
    picks)
      case "$GPU" in *H100*) ;; *) echo "not an H100: no random-test picks"; continue;; esac
      timeout $(( L < 240 ? L : 240 )) python3 -m gnn_policy.cli sweep --db /tmp/s.sqlite --split random-test --problems 80 \
        --configs 200 --space hopper-tested --policy checkpoints/pretrained.pt --time-limit $(mins $(( L < 240 ? L - 40 : 200 ))) --timeout 10 \
        --shard-dir $R/s > $R/picks.log 2>&1 ;;
    sweep200)
      case "$GPU" in *H200*) ;; *) echo "not an H200: no H200 random-test sweep"; continue;; esac
      timeout $L python3 -m gnn_policy.cli sweep --db /tmp/s.sqlite --split random-test --problems 80 \
        --configs 1000 --space hopper-tested --policy checkpoints/pretrained.pt --time-limit $(mins $((L-50))) \
        --timeout 10 --compile-timeout 60 --shard-dir $R/s > $R/sweep.log 2>&1 ;;
    sweep48)
      case "$GPU" in *H200*) B=h200;; *) B=h100;; esac
      GNN_POLICY_DB=/tmp/s48.sqlite python3 -m gnn_policy.cli stats > $R/sweep48_stats.log 2>&1; L=$(left)
      timeout $L python3 -m gnn_policy.cli sweep --gpu $B-sm48 --db /tmp/s48.sqlite --split random-test --problems 40 \
        --configs 1000 --space hopper-tested --policy checkpoints/pretrained.pt --time-limit $(mins $((L-50))) \
        --timeout 10 --compile-timeout 60 --shard-dir $R/s > $R/sweep48.log 2>&1 ;;
    serve48)
      # issue 22's Done-when on the GPU: plain.pt fine-tuned with 64 measurements in all on sm48's test
      # problems (transfer's served, as finetune --keys), its top 8 measured; an H200 only
      case "$GPU" in *H200*) ;; *) echo "not an H200: no sm48 serve"; continue;; esac
      timeout $L python3 -m gnn_policy.cli transfer --target h200-sm48 --plain checkpoints/plain.pt --methods served \
        --budgets 0,64 --seeds 0 --no-wandb --time-limit $(mins $((L-60))) --timeout 10 --work /tmp/serve48 \
        --out $R/serve48 --shard-dir $R/t > $R/serve48.log 2>&1 ;;
    e2e)
      # resumes from the rows shipped for this GPU (the script skips the rows its --out holds)
      mkdir -p $R/e2e; case "$GPU" in *H200*) D=H200-SXM-141GB;; *H100*) D=H100-SXM5-80GB;; *) D=none;; esac
      cp docs/data/model_e2e/$D/model_e2e.jsonl $R/e2e/ 2>/dev/null
      timeout $L python3 -m gnn_policy.benchmarks.model_e2e --out $R/e2e --time-limit $(mins $((L-120))) > $R/e2e.log 2>&1 ;;
    plantests)
      timeout $(( L < 200 ? L : 200 )) python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_kernel_gpu.py \
        -k "plan or patched_layer" > $R/plantests.log 2>&1 ;;
    e2eplan)
      # eager and patch alone, from scratch: what launch plans change is patch's time without graphs
      mkdir -p $R/e2eplan
      timeout $L python3 -m gnn_policy.benchmarks.model_e2e --out $R/e2eplan --modes eager,patch \
        --time-limit $(mins $((L-60))) > $R/e2eplan.log 2>&1 ;;
    host)
      timeout $(( L < 120 ? L : 120 )) python3 -m gnn_policy.benchmarks.host_overhead --profile $R/host_prof.txt > $R/host.log 2>&1 ;;
    adapter)
      timeout $(( L < 280 ? L : 280 )) python3 -m gnn_policy.benchmarks.adapter_bench --out $R/adapter > $R/adapter.log 2>&1 ;;
    wsprobe)
      timeout $(( L < 330 ? L : 330 )) python3 -m gnn_policy.benchmarks.warpspec_probe --out $R/probe.jsonl \
        --markdown $R/probe.md --timeout 90 > $R/probe.log 2>&1 ;;
    wstrial)
      GNN_POLICY_GPU_TRIAL_CASES=160 GNN_POLICY_GPU_REPORT=$R/cases.json \
        timeout $(( L < 300 ? L : 300 )) python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernel_gpu.py \
        -k warpspec_trial > $R/wstrial.log 2>&1; rc=$?; cp $R/wstrial.log /tmp/wstrial_last.log; (exit $rc) ;;
    wsceiling)
      # a warm machine keeps /tmp: the trial may have passed in the call before this one
      grep -q "1 passed" $R/wstrial.log /tmp/wstrial_last.log 2>/dev/null || { echo "no passed warpspec trial: no ceiling"; continue; }
      GNN_POLICY_LIFT_RULES=warpspec-sm90 timeout $L python3 -m gnn_policy.benchmarks.ceiling --db /tmp/w.sqlite \
        --load docs/data/ceiling --shapes 15 --configs 24 --named triton_tutorial --named inductor_mm --refine-top 2 \
        --variant warpspec --time-limit $(mins $(( L - 40 < 300 ? L - 40 : 300 ))) --timeout 10 --shard-dir $R/w \
        --json $R/wsceiling.json --markdown $R/wsceiling.md > $R/wsceiling.log 2>&1 ;;
    collect)
      timeout $L python3 -m gnn_policy.cli collect --db /tmp/r.sqlite --split random-train --problems 2500 --configs 100 \
        --pool 100 --pool-by-class --space hopper-tested --named triton_tutorial --named inductor_mm \
        --policy checkpoints/pretrained.pt --policy-top 4 \
        --time-limit $(mins $((L-50))) --timeout 10 --compile-timeout 60 --shard-dir $R/t > $R/collect.log 2>&1 ;;
    slices)
      # issue 22's training slices over random shapes, of whichever GPU came (the H100's while the H200
      # is not lent): each slice an equal share of the time left, resuming from the shipped shards
      case "$GPU" in *H200*) B=h200;; *) B=h100;; esac; SL=(${SLICES:-64 32 96 16})
      # the shards load once, before the shares are cut: in the first call they took sm64's share
      GNN_POLICY_DB=/tmp/sl.sqlite python3 -m gnn_policy.cli stats > $R/slice_stats.log 2>&1; L=$(left)
      SHARE=$(( (L - 30) / ${#SL[@]} ))
      for sm in "${SL[@]}"; do
        timeout $SHARE python3 -m gnn_policy.cli collect --gpu $B-sm$sm --db /tmp/sl.sqlite --split random-train \
          --problems 800 --configs 50 --pool 100 --pool-by-class --space hopper-tested --named triton_tutorial \
          --named inductor_mm --max-gflop ${SLICE_MAX_GFLOP:-100} --time-limit $(mins $(( SHARE - 25 ))) --timeout 10 \
          --compile-timeout 60 --shard-dir $R/t > $R/slice_sm$sm.log 2>&1; echo "   sm$sm rc $?"
      done ;;
  esac
  echo "   rc $?"
done
[ -n "${NO_TAR:-}" ] && exit 0
echo "== tar at $(( $(date +%s) - START )) s"
tar czf $OUT/results.tgz -C $R .
