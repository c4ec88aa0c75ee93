#!/usr/bin/env bash
# One device call = several steps of device work, each under its own time limit, every log and
# result under $OUT (the device tool brings back 8 files at most: folders travel as tarballs).
# Usage on the lent GPU, after `source .carry/setup.sh` (and `.carry-fi/setup.sh` for FlashInfer):
#   bash scripts/device_steps.sh STEP[:SECONDS] ...   (a step without SECONDS gets the call's rest)
# Steps:
#   env        GPU, driver and package versions
#   triton     issue 2: tune the Qwen3.5-397B TP8 bf16 fused-MoE configs, all 18 M (fresh --out)
#   fp8        the same for block-FP8 experts (FP8_TAG names a re-run's storage, folder and cache)
#   harness    issue 4: decode harness, SGLang's configs vs the ones `triton` just wrote
#   backends   issue 3: fp8_gemm, moe_fp8, moe_bf16 backend choice and server_args.yaml
#   tactics    issue 10: the FP8 GEMM backends with every tactic FlashInfer's runners offer (TACTIC_BS
#              batch sizes), FlashInfer's cache and blocklist written, --json summary in $WORK/tactics.json
#   sieve      issue 22: every MoE runner and FP4 GEMM backend SGLang offers, launched through SGLang's own
#              layers (NVFP4, bf16, block-FP8 experts; NVFP4 dense GEMMs), outcomes with evidence, server_args.yaml
#              (SIEVE_BS batch sizes, SIEVE_SKIP backends left out; needs the SGLang 0.5.23 carry:
#              `source .sglang023/carry/setup.sh`, from scripts/make_sglang023_carry.sh, plus optuna's wheels)
#   jit        issue 22: SGLang's marlin NVFP4 JIT modules built side by side (scripts/sglang_jit_prebuild.py), then
#              checked through SGLang's layers (benchmarks/sglang_layer_probe.py), which also builds the small ones
#              (moe_align, activation). With SGLANG_JIT_CACHE_DIR set, every call packs that cache without object
#              files as $OUT/sgjit.tar.xz (~9 MB); a later call carries it and sets SGLANG_JIT_TARBALL to unpack it.
#              The device tool counts the working tree into its 64 MiB: with the carry and this cache, move the
#              server-only wheels (transformers, xgrammar, soundfile) out of .sglang023/carry and tests/ and
#              benchmarks/{data,results} out of the tree for the call; the layer path needs none of them.
#   probe      issue 10: a fresh process loads that cache: benchmarks/flashinfer_cache_probe.py --all
#   state      what sets a lone process's later CUDA-graph timings apart: benchmarks/timing_state_probe.py
#              (STATE_ORDERS, default: the script's own set)
#   warm       issue 12: cold vs --warm-start runs of E=256,N=128 and E=512,N=256 bf16 (WARM_RUNS, WARM_BS, WARM_TRIALS)
#   check      issue 12: `autotune check` of the committed H200 folder: versions, then each Triton MoE file
#              re-timed as SGLang runs the layer, tuned vs shipped vs default (CHECK_BS batch sizes)
#   mem=WHAT@CAP  issue 35: a run under a GPU memory cap (CAP: full, or AUTOTUNE_GPU_MEMORY's value, e.g. 32GiB),
#              default workers; WHAT: bf16 / fp8 (Qwen3.5-397B TP8 fused-MoE Triton configs, MEM_BUDGET each) or
#              backends (fp8_gemm, moe_fp8, moe_bf16; MEM_BS batch sizes, default all). Then
#              benchmarks/memory_audit.py: stored verdicts by status, resource failures stored as a config's
#              failure (must be 0), keys per written file (must be 18). GPU memory used is in clocks.csv.
#   agree      issue 42: does the tool's layer timing agree with SGLang's own fused_experts? The disputed M=1 pair,
#              SGLang's shipped and default pairs at AGREE_MS (benchmarks/layer_agreement.py)
#   pace=TAG   issue 42: the README's run as a new user makes it (Qwen3.5-397B TP8 bf16, default flags, fresh storage,
#              an empty Triton cache), --budget PACE_BUDGET (150s), PACE_ARGS added; its wall time, pace (--json) and
#              the memory audit
#   recheck=TAG  `autotune check` of pace=TAG's folder with the re-timing (CHECK_BS)
#   confirm    issue 12: a short block-FP8 run (CONFIRM_BS, CONFIRM_BUDGET) whose per-M picks are confirmed as
#              SGLang runs the layer (autotune/families/triton_moe/confirm.py); its provenance holds per_M[M]["layer"]
# Every call logs the GPU's SM/memory clocks, power and use every 100 ms to $OUT/clocks.csv (timing
# across processes is compared against it).
# Work files live in $WORK (default /tmp/at); the SQLite study travels back in work.tgz so a
# later call can resume a run cut short by its limit (carry it and set RESUME=work.tgz).
set -uo pipefail
OUT=${OUT:?run through the device tool: \$OUT is where results go}
WORK=${WORK:-/tmp/at}
mkdir -p "$WORK"
# once, in the call's own shell: each step re-runs this script (`__step`), and extracting again there
# would put back the resumed files a step before it rewrote (seen: probe.json of the earlier call)
[ "${1:-}" != __step ] && [ -n "${RESUME:-}" ] && [ -f "$RESUME" ] && tar -xzf "$RESUME" -C "$WORK"
# a JIT cache an earlier call packed (step jit): SGLang finds its modules there instead of building them
[ "${1:-}" != __step ] && [ -n "${SGLANG_JIT_TARBALL:-}" ] && mkdir -p "${SGLANG_JIT_CACHE_DIR:?}" &&
  tar -xJf "$SGLANG_JIT_TARBALL" -C "$SGLANG_JIT_CACHE_DIR" --strip-components=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
at() { python3 -m autotune "$@"; }
MODEL=(--model qwen3.5-397b-a17b --tp 8)
STORE=sqlite:///$WORK/autotune.db
TUNED=$WORK/tuned

step_env() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton, optuna, sglang; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| triton', triton.__version__, '| optuna', optuna.__version__, '| sglang', sglang.__version__)"
  python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1
  nproc
}

step_triton() {
  at run "${MODEL[@]}" --dtype bf16 --kernels triton_moe --gpus all --budget "${TRITON_BUDGET:-300s}" \
     --storage "$STORE" --out "$TUNED" --record "$WORK/run_bf16.jsonl.gz" --quiet
}

step_fp8() {
  # The same tuning for block-FP8 experts, in its own storage and folder (a second run of it must
  # not mix with an earlier one's studies, cache or files).
  at run "${MODEL[@]}" --dtype fp8_w8a8_block --kernels triton_moe --gpus all --budget "${FP8_BUDGET:-380s}" \
     --storage "sqlite:///$WORK/fp8${FP8_TAG:-}.db" --out "$WORK/tuned_fp8${FP8_TAG:-}" \
     --record "$WORK/run_fp8${FP8_TAG:-}.jsonl.gz" --quiet
}

step_harness() {
  at validate --engine harness "${MODEL[@]}" --configs "$TUNED/NVIDIA_H200" --out "$WORK/validation" --gate
}

step_backends() {
  # FlashInfer's CUTLASS MoE JIT build is ~30 min on 16 cores: over one call, so left out here.
  # Its own storage: a resumed work folder must not replay an earlier call's backend measurements
  # (failures of a missing module included).
  at run "${MODEL[@]}" --kernels fp8_gemm,moe_fp8,moe_bf16 --gpus all --out "$TUNED" \
     --storage "sqlite:///$WORK/backends$(date +%s).db" \
     --skip-backends flashinfer_cutlass --record "$WORK/backends.jsonl.gz" --quiet
}

step_tactics() {
  at run "${MODEL[@]}" --kernels fp8_gemm --gpus all --batch-sizes "${TACTIC_BS:-1,8,64,512}" --out "$WORK/tactics" \
     --storage "sqlite:///$WORK/tactics.db" --record "$WORK/tactics.jsonl.gz" --json "$WORK/tactics.json" --quiet
}

step_sieve() {
  # without a carried JIT cache (step jit) the marlin MoE runners' builds outlast a call: left out
  local skip=moe_bf16:flashinfer_cutlass
  [ -z "${SGLANG_JIT_TARBALL:-}" ] && skip=marlin,experimental_sgl_marlin,lora_marlin,$skip
  at run "${MODEL[@]}" --kernels moe_fp4,fp4_gemm,moe_bf16,moe_fp8 --gpus all --batch-sizes "${SIEVE_BS:-1,64}" \
     --skip-backends "${SIEVE_SKIP:-$skip}" --timeout "${SIEVE_TIMEOUT:-150}" \
     --storage "sqlite:///$WORK/sieve.db" --out "$WORK/sieve" --record "$WORK/sieve.jsonl.gz" \
     --json "$WORK/sieve.json" --checkpoint moe_fp4 --worker-log "$WORK/workers.log" --quiet
  cat "$WORK"/sieve/*/server_args.yaml 2>/dev/null
}

step_jit() {
  : "${SGLANG_JIT_CACHE_DIR:?the jit step fills SGLANG_JIT_CACHE_DIR}"
  python3 scripts/sglang_jit_prebuild.py
  python3 benchmarks/sglang_layer_probe.py --cases moe:nvfp4:marlin,fp4:nvfp4:marlin --timeout 200 \
     --out "$WORK/jit_probe.json" --logs "$WORK"
}

step_probe() {
  python3 benchmarks/flashinfer_cache_probe.py --all --summary "$WORK/tactics.json" \
     --cache "$WORK/tactics/NVIDIA_H200/flashinfer_autotune_cache.json" --out "$WORK/probe.json"
}

step_state() {
  # shellcheck disable=SC2086  # STATE_ORDERS is a list of orders
  python3 benchmarks/timing_state_probe.py --out "$WORK/state.json" ${STATE_ORDERS:-}
}

step_check() {
  at check tuned_configs/NVIDIA_H200 --sglang-version 0.5.23 --batch-sizes "${CHECK_BS:-1,8,32,64,256,1024,4096}"
}

step_confirm() {
  at run "${MODEL[@]}" --dtype fp8_w8a8_block --kernels triton_moe --gpus all --batch-sizes "${CONFIRM_BS:-1,64,1024}" \
     --budget "${CONFIRM_BUDGET:-150s}" --storage "sqlite:///$WORK/confirm.db" --out "$WORK/confirm" \
     --json "$WORK/confirm.json" --quiet
  python3 -c "import json,sys
for name, f in json.load(open(sys.argv[1]))['files'].items():
    for M, v in sorted(f.get('per_M', {}).items(), key=lambda kv: int(kv[0])): print(name, M, json.dumps(v.get('layer')))" \
     "$(ls "$WORK"/confirm/*/provenance.json | head -1)" 2>&1 | cut -c1-400
}

step_agree() {
  python3 benchmarks/layer_agreement.py --Ms "${AGREE_MS:-1,2,4,8,64,1024}" --out "$WORK/layer_agreement.json"
}

step_pace() {
  local tag=$1 t0 rc
  # shellcheck disable=SC2086  # PACE_ARGS is a list of flags
  t0=$(date +%s.%N)
  TRITON_CACHE_DIR=/tmp/triton_pace_$tag at run "${MODEL[@]}" --dtype "${PACE_DTYPE:-bf16}" --kernels triton_moe --gpus all \
     --budget "${PACE_BUDGET:-150s}" --storage "sqlite:///$WORK/pace_$tag.db" --out "$WORK/pace_$tag" \
     --json "$WORK/pace_$tag.json" --worker-log "$WORK/pace_$tag.workers.log" ${PACE_ARGS:-}
  rc=$?
  echo "--- pace $tag: autotune exit $rc, wall $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$t0" "$(date +%s.%N)") s (budget ${PACE_BUDGET:-150s})"
  python3 benchmarks/memory_audit.py --storage "sqlite:///$WORK/pace_$tag.db" --out "$WORK/pace_$tag" \
     --json "$WORK/pace_$tag.audit.json"
}

step_recheck() {
  # `autotune check` of the folder pace=TAG wrote, re-timing it as SGLang serves the layer (CHECK_BS)
  at check "$WORK/pace_$1/$(ls "$WORK/pace_$1" | head -1)" --sglang-version 0.5.23 --batch-sizes "${CHECK_BS:-1,8,64,1024}"
}

step_warm() {
  # issue 12: device time to within 2% of the best, cold vs warm-started from the E=512,N=128 bf16 H200 run;
  # same trials, same seed, one storage each (the trials' completion times are the clock:
  # benchmarks/warm_start_h200.py). WARM_RUNS: "model:tp ..." (default the two shapes the issue names).
  local spec model tp mode ws
  for spec in ${WARM_RUNS:-qwen3.5-122b-a10b:8 qwen3.5-397b-a17b:4}; do
    model=${spec%%:*}; tp=${spec#*:}
    for mode in cold warm; do
      ws=(); [ $mode = warm ] && ws=(--warm-start benchmarks/data/h200_run_bf16_2026-12-01.jsonl.gz)
      echo "--- $model tp$tp $mode $(date -u +%T)"
      at run --model "$model" --tp "$tp" --dtype bf16 --kernels triton_moe --gpus all --batch-sizes "${WARM_BS:-1,32,256}" \
         --trials "${WARM_TRIALS:-30}" --seed 0 "${ws[@]}" --storage "sqlite:///$WORK/warm_${model}_tp${tp}_$mode.db" \
         --out "$WORK/warm_${model}_tp${tp}_$mode" --quiet 2>&1 | tail -25
    done
  done
}

step_mem() {
  local what=${1%@*} cap=${1#*@} tag=${1/@/_} args
  case $what in
    bf16) args=(--dtype bf16 --kernels triton_moe --budget "${MEM_BUDGET:-150s}") ;;
    fp8) args=(--dtype fp8_w8a8_block --kernels triton_moe --budget "${MEM_BUDGET:-150s}") ;;
    backends) args=(--kernels fp8_gemm,moe_fp8,moe_bf16 --skip-backends flashinfer_cutlass)
              [ -n "${MEM_BS:-}" ] && args+=(--batch-sizes "$MEM_BS") ;;
    *) echo "mem: unknown run $what"; return 2 ;;
  esac
  if [ "$cap" = full ]; then unset AUTOTUNE_GPU_MEMORY; else export AUTOTUNE_GPU_MEMORY=$cap; fi
  echo "--- mem $what, cap ${AUTOTUNE_GPU_MEMORY:-none} $(date -u +%T)"
  at run "${MODEL[@]}" "${args[@]}" --gpus all --storage "sqlite:///$WORK/mem_$tag.db" --out "$WORK/mem_$tag" \
     --json "$WORK/mem_$tag.json" --quiet
  echo "--- mem $tag: autotune exit $?"
  python3 benchmarks/memory_audit.py --storage "sqlite:///$WORK/mem_$tag.db" --out "$WORK/mem_$tag" \
     --json "$WORK/mem_$tag.audit.json"
  echo "--- mem $tag: audit exit $?"
}

# a step named NAME=ARG runs step_NAME ARG
if [ "${1:-}" = __step ]; then
  case $2 in *=*) step_"${2%%=*}" "${2#*=}" ;; *) step_"$2" ;; esac
  exit
fi

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used \
  --format=csv -lms 100 > "$OUT/clocks.csv" 2>/dev/null &
clock_log=$!
pack() {   # what comes back: logs, and the work folder as one tarball
  kill "$clock_log" 2>/dev/null
  tar -czf "$OUT/work.tgz" -C "$WORK" . 2>/dev/null
  # what a run said and wrote, without its storage (work.tgz may pass the 16 MiB a file may bring back)
  tar -czf "$OUT/results.tgz" -C "$WORK" --exclude='*.db' --exclude='*.jsonl.gz' . 2>/dev/null
  [ -d "${SGLANG_JIT_CACHE_DIR:-}" ] && XZ_OPT=-T0 tar -cJf "$OUT/sgjit.tar.xz" --exclude='*.o' \
     -C "$SGLANG_JIT_CACHE_DIR" --transform 's,^\.,sgjit,' .
}
trap pack EXIT

# A step without :SECONDS gets what is left of CALL_LIMIT (the device tool stops a call at 600 s),
# and is skipped when under a minute is left.
call_end=$(( $(date +%s) + ${CALL_LIMIT:-585} ))
for spec in "$@"; do
  name=${spec%%:*}; limit=${spec#*:}
  left=$(( call_end - $(date +%s) ))
  { [ "$limit" = "$spec" ] || [ "$limit" -gt "$left" ]; } && limit=$left
  if [ "$left" -lt 60 ]; then echo "=== step $name skipped: ${left}s left in this call"; continue; fi
  echo "=== step $name (limit ${limit}s) $(date -u +%FT%TZ)" | tee -a "$OUT/steps.txt"
  t0=$(date +%s)
  # `timeout` stops a step, not the call: the next steps and the packing still run.
  timeout -k 10 "$limit" bash "$0" __step "$name" 2>&1 | tee "$OUT/$(tr -c 'A-Za-z0-9._\n-' _ <<< "$name").log"
  echo "=== step $name rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 ))s"
done
