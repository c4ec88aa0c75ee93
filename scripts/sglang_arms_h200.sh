#!/usr/bin/env bash
# SGLang 0.5.16's real server code on the lent H200: decode speed of one TP8 rank of Qwen3.5-397B-A17B
# (60 layers, dummy weights) with three fused-MoE config arms, interleaved:
#   default  SGLANG_MOE_CONFIG_DIR = an empty folder: SGLang finds no file and uses get_default_config
#   shipped  SGLANG_MOE_CONFIG_DIR unset: SGLang's own shipped files
#   tuned    SGLANG_MOE_CONFIG_DIR = $TUNED (a folder `autotune run/export --sglang-version 0.5.16` wrote)
# Built here first: `bash scripts/make_sglang016_carry.sh` (-> .sglang016/carry, ~46 MiB, git-ignored).
# Device call (see docs/VALIDATE.md):
#   run(command="MODE=one_batch bash scripts/sglang_arms_h200.sh", carry=[".sglang016/carry", ".sglang016/cache"])
# SGLANG=0.5.23: SGLang 0.5.23 instead (carry from scripts/make_sglang023_carry.sh -> .sglang023/carry, ~47 MiB;
#   carry=[".sglang023/carry", ".sglang023/cache"]); one-batch module sglang.benchmark.one_batch, same flags.
# MODE=one_batch: `python -m sglang.bench_one_batch` per arm and repeat (decode step latency per batch size:
#                 SGLang's ModelRunner with CUDA graphs, no scheduler/HTTP).
# MODE=server:    `python -m sglang.launch_server` per arm and repeat, measured by scripts/sglang_decode_probe.py
#                 (decode tokens/s of a batch of requests through HTTP, scheduler included).
# Env: REPS (3), REP_FROM (1: the first repeat's number), BS ("1 8 32 64 128 256"), ARMS ("default shipped tuned"), DTYPE (bf16 | fp8_block),
#      TUNED (tuned_configs/sglang-0.5.16/NVIDIA_H200; 0.5.23: tuned_configs/NVIDIA_H200), LAYERS (60),
#      DEADLINE (s, 570), SGLANG (0.5.16 | 0.5.23).
# Everything lands in $OUT: runs.tgz (every log and result), summary.txt, the compile caches for the next call.
set -uo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
T0=$(date +%s); DEADLINE=${DEADLINE:-570}; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
MODE=${MODE:-one_batch}; REPS=${REPS:-3}; BS=${BS:-"1 8 32 64 128 256"}; ARMS=${ARMS:-"default shipped tuned"}
DTYPE=${DTYPE:-bf16}; LAYERS=${LAYERS:-60}; SGLANG=${SGLANG:-0.5.16}
case $SGLANG in
  0.5.16) D=.sglang016; BENCH=sglang.bench_one_batch; TUNED=${TUNED:-tuned_configs/sglang-0.5.16/NVIDIA_H200} ;;
  # sglang-kernel 0.4.5 is carried instead of the pinned 0.4.10: skip SGLang's start-up kernel version check.
  0.5.23) D=.sglang023; BENCH=sglang.benchmark.one_batch; TUNED=${TUNED:-tuned_configs/NVIDIA_H200}
          export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 ;;
  *) echo "SGLANG=$SGLANG: 0.5.16 or 0.5.23"; exit 2 ;;
esac
# An empty config folder SGLang can list (it reads $SGLANG_MOE_CONFIG_DIR/configs/): no file -> default config.
RUNS=/tmp/arms_runs; mkdir -p $RUNS /tmp/moe_empty/configs
source $D/carry/setup.sh || { echo "setup failed rc=$?"; exit 3; }
[ -f $D/cache/tvmffi_cache.tar.xz ] && mkdir -p ~/.cache && tar -xJf $D/cache/tvmffi_cache.tar.xz -C ~/.cache
[ -f $D/cache/triton_cache.tar.xz ] && tar -xJf $D/cache/triton_cache.tar.xz -C /tmp
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import importlib.metadata as md, torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '| sglang', md.version('sglang'), '| sglang-kernel', md.version('sglang-kernel'), '| flashinfer', md.version('flashinfer-python'), '| transformers', md.version('transformers'))"
} 2>&1 | grep -v Warning | tee $RUNS/env.txt
MODEL=/tmp/rank_model_$DTYPE
extra=(); [ "$DTYPE" = fp8_block ] && extra=(--fp8-block)
PYTHONPATH=$PWD:$PYTHONPATH python3 -m autotune rank-model --model qwen3.5-397b-a17b --tp 8 --layers "$LAYERS" \
  --out $MODEL "${extra[@]}" || exit 4
echo "setup done at +$(( $(date +%s) - T0 ))s"

arm_env() {  # arm -> env assignments for `env`
  case $1 in
    default) echo SGLANG_MOE_CONFIG_DIR=/tmp/moe_empty ;;
    shipped) echo -u SGLANG_MOE_CONFIG_DIR ;;
    tuned)   echo SGLANG_MOE_CONFIG_DIR=$PWD/$TUNED ;;
  esac
}
# --disable-radix-cache: random prompts share nothing, and without it SGLang keeps 3 Gated-DeltaNet states per
# request slot, which caps one H200 rank at 111 concurrent requests (batch 128 and 256 would not fit).
COMMON="--load-format dummy --attention-backend triton --sampling-backend pytorch --grammar-backend none --disable-radix-cache
  --mm-attention-backend triton_attn --disable-prefill-cuda-graph --cuda-graph-bs-decode $BS
  --mem-fraction-static 0.88 --log-level info"
evidence() { grep -aE "MoE kernel config|MoE config|down_moe config|TreeCore|Fallback to triton|Config file not found|default MoE|Using default|max_total_num_tokens|Traceback|Error" "$1" | cut -c1-300 | uniq | head -8; }

one_batch() {  # tag arm
  local tag=$1 arm=$2 s=$(date +%s) t=$(( $(left) - 10 ))
  if [ "$t" -lt 60 ]; then echo "== $tag: skipped, $(left)s left"; return 9; fi
  env $(arm_env $arm) timeout -k 5 $t python3 -m $BENCH --model-path $MODEL $COMMON \
      --batch-size $BS --input-len 256 --output-len 32 --run-name $tag --result-filename $RUNS/$tag.jsonl \
      > $RUNS/$tag.log 2>&1
  local rc=$?
  echo "== $tag rc=$rc $(( $(date +%s) - s ))s"; evidence $RUNS/$tag.log
  grep -aE "Decode\.  median" $RUNS/$tag.log | cut -c1-120 | tr '\n' ';'; echo
  [ $rc -ne 0 ] && tail -15 $RUNS/$tag.log | cut -c1-300
  return $rc
}

server() {  # tag arm
  local tag=$1 arm=$2 s=$(date +%s) ready=0
  if [ "$(left)" -lt 90 ]; then echo "== $tag: skipped, $(left)s left"; return 9; fi
  env $(arm_env $arm) setsid python3 -m sglang.launch_server --model-path $MODEL $COMMON --skip-tokenizer-init \
      --host 127.0.0.1 --port 30000 > $RUNS/$tag.log 2>&1 &
  local pid=$!
  while [ $(( $(date +%s) - s )) -lt 240 ] && [ "$(left)" -gt 40 ]; do
    grep -q "ready to roll" $RUNS/$tag.log && { ready=1; break; }
    kill -0 $pid 2>/dev/null || break; sleep 1
  done
  echo "== $tag ready=$ready after $(( $(date +%s) - s ))s"; evidence $RUNS/$tag.log
  local rc=1
  if [ $ready = 1 ]; then
    timeout $(( $(left) - 15 )) python3 scripts/sglang_decode_probe.py --port 30000 --bs $BS --input-len 256 \
        --new 64 --reps 3 --tag $tag > $RUNS/$tag.probe.jsonl; rc=$?
    cut -c1-200 $RUNS/$tag.probe.jsonl
  else
    tail -20 $RUNS/$tag.log | cut -c1-300
  fi
  kill -- -$pid 2>/dev/null; sleep 1; kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  local k; for k in $(seq 30); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 1; done
  return $rc
}

# Arms rotate per repeat (ABC, BCA, CAB): drift over the call falls on every arm alike.
read -ra arms <<< "$ARMS"; n=${#arms[@]}; ok=0; failed=0
for r in $(seq "${REP_FROM:-1}" $(( ${REP_FROM:-1} + REPS - 1 ))); do
  for i in $(seq 0 $((n - 1))); do
    arm=${arms[$(( (i + r - 1) % n ))]}
    $MODE ${MODE}_${DTYPE}_r${r}_${arm} $arm && ok=$((ok + 1)) || failed=$((failed + 1))
    # A stack that cannot run (a first-time carry) fails every run alike: stop after two failures with no success.
    [ "$ok" -eq 0 ] && [ "$failed" -ge 2 ] && { echo "== stopping: $failed runs failed, none succeeded"; break 2; }
  done
done
tar -C /tmp -czf $OUT/runs_${MODE}_${DTYPE}.tgz arms_runs
[ -d ~/.cache/tvm-ffi ] && tar -C ~/.cache -cJf $OUT/tvmffi_cache.tar.xz tvm-ffi
[ -d /tmp/triton_cache ] && tar -C /tmp -cJf $OUT/triton_cache.tar.xz triton_cache
for f in $OUT/*_cache.tar.xz; do [ -f "$f" ] && [ $(stat -c %s "$f") -gt 14000000 ] && { echo "dropping $f"; rm -f "$f"; }; done
ls -la $OUT; echo "total +$(( $(date +%s) - T0 ))s"
