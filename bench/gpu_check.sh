#!/usr/bin/env bash
# On a GPU host, in one go: configure and build dstrain with CUDA (Release), run the GPU tests, the
# benchmarks and the PyTorch comparison, then the CPU test suite against this LibTorch. Everything
# goes to RESULTS_DIR/gpu_check.log (JSON figures beside it); the end of the output is a summary.
#   bench/gpu_check.sh RESULTS_DIR [cmake arguments: where LibTorch, MPI, HDF5, NCCL are]
# BUILD_DIR keeps the build between runs; GPU_CHECK_ONLY (a regular expression over the stage
# names below) runs just those stages after the build, to split the whole into shorter runs;
# BUILD_TARGETS (names separated by spaces) builds only those, e.g. "dstrain dstrain_mpi_tests
# dstrain_gpu_tests" for the GPU tests and benchmarks without the CPU suite's programs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
results=${1:?usage: bench/gpu_check.sh RESULTS_DIR [cmake arguments]}
shift
mkdir -p "$results"
log=$results/gpu_check.log
build=${BUILD_DIR:-/tmp/dstrain-build-gpu}
summary=()
stage() {  # stage NAME COMMAND...: runs it, logs it, remembers how it ended
  local name=$1 started=$SECONDS
  shift
  if [[ -n ${GPU_CHECK_ONLY:-} && ! $name =~ ^(configure|build) && ! $name =~ $GPU_CHECK_ONLY ]]; then return 0; fi
  echo "=== $name: $*" >>"$log"
  "$@" >>"$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - started)))")
  return $rc
}
cd "$root"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "cudnn", torch.backends.cudnn.version())'
  # Which attention kernel LibTorch picks for the 1B preset's shapes (bf16, 16 heads of 128, 2048 positions, causal).
  python3 -c 'import torch; q = torch.randn(4, 16, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True); print("sdpa backend for the 1B shapes:", torch._fused_sdp_choice(q, q, q, is_causal=True), [(b.name, int(b.value)) for b in torch.nn.attention.SDPBackend.__members__.values()])'
} >>"$log" 2>&1
# Should dstrain's own CUDA kernels not build here, the rest is still worth measuring without them.
# (ON said again: a build directory that the fallback below configured keeps OFF in its cache.)
{ stage configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" -DDSTRAIN_CUDA_KERNELS=ON &&
    stage build cmake --build "$build" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}; } ||
  { stage "configure, no kernels" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" \
      -DDSTRAIN_CUDA_KERNELS=OFF &&
      stage "build, no kernels" cmake --build "$build" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}; } ||
  { tail -60 "$log"; printf '%s\n' "${summary[@]}"; exit 1; }
grep -E "CUDA: |NCCL backend" "$log" | tail -1
stage "ctest gpu" ctest --test-dir "$build" -L gpu --output-on-failure -j 2
# The routed experts' grouped product against one product per expert (train.grouped_experts).
stage "grouped experts (V2-Lite shapes)" env DSTRAIN="$build/dstrain" bash -c 'set -o pipefail; bench/grouped_experts.sh | tee "$0"' \
  "$results/grouped_experts.txt"
# FP8 training's recipes against bf16 (train.fp8): the 1B step and the V2-Lite-shaped MoE step.
stage "fp8 (1B, V2-Lite shapes)" env DSTRAIN="$build/dstrain" RESULTS_DIR="$results" \
  bash -c 'set -o pipefail; bench/fp8.sh | tee "$0"' "$results/fp8.txt"
stage "bench step (1B, bf16)" env DSTRAIN="$build/dstrain" RESULTS_DIR="$results" bench/compare_pytorch.sh
# What dstrain's own kernels gain: the 4 x 2 step again with LibTorch's operations instead.
stage "bench step, LibTorch ops" "$build/dstrain" bench step --config input/deepseek-llm-1b.ini \
  --train.cuda_kernels false --bench.json "$results/step_mb4_ga2_no_kernels.json"
# Where the 1B step's GPU time goes, by model part and by kernel (issue: the step ahead of torch.compile),
# and the same for the V2-Lite-shaped MoE step: tables and Chrome traces beside the log.
stage "profile 1B step" "$build/dstrain" bench step --config input/deepseek-llm-1b.ini --bench.steps 4 \
  --bench.profile "$results/profile_1b"
stage "profile MoE step" "$build/dstrain" bench step --config input/deepseek-v2-lite.ini --model.num_layers 3 \
  --train.micro_batch 4 --train.grad_accum 1 --bench.steps 4 --bench.profile "$results/profile_moe"
stage "bench step micro_batch 8" "$build/dstrain" bench step --config input/deepseek-llm-1b.ini \
  --train.micro_batch 8 --train.grad_accum 1 --bench.json "$results/step_mb8.json"
stage "pytorch eager micro_batch 8" python3 bench/pytorch_reference.py --config input/deepseek-llm-1b.ini \
  --micro-batch 8 --grad-accum 1 --json "$results/eager_mb8.json"
# A step as each GPU of an 8-GPU data-parallel job with a 1M-token global batch takes it: the
# optimizer's passes over the parameters are shared by 8 micro-batches.
stage "bench step 8 x 8" "$build/dstrain" bench step --config input/deepseek-llm-1b.ini \
  --train.micro_batch 8 --train.grad_accum 8 --bench.json "$results/step_mb8_ga8.json"
stage "pytorch eager 8 x 8" python3 bench/pytorch_reference.py --config input/deepseek-llm-1b.ini \
  --micro-batch 8 --grad-accum 8 --json "$results/eager_mb8_ga8.json"
stage "bench step micro_batch 16" "$build/dstrain" bench step --config input/deepseek-llm-1b.ini \
  --train.micro_batch 16 --train.grad_accum 1 --bench.json "$results/step_mb16.json"
# Activation memory per train.recompute mode against `model info`'s estimate, and step times.
stage "recompute modes (1B)" env DSTRAIN="$build/dstrain" bash -c 'set -o pipefail; bench/recompute.sh gpu | tee "$0"' \
  "$results/recompute_gpu.txt"
# The pipeline schedules' bubbles on CPU ranks, one core each, which a 2-core machine cannot give 4 stages.
stage "pipeline schedules (CPU ranks)" env DSTRAIN="$build/dstrain" bash -c 'set -o pipefail; bench/pipeline_schedules.sh | tee "$0"' \
  "$results/pipeline_schedules_cpu.txt"
stage "bench comm" "$build/dstrain" bench comm --bench.json "$results/comm.json" --bench.iters 10
stage "bench memory" "$build/dstrain" bench memory --bench.json "$results/memory.json"
stage "ctest cpu (LibTorch 2.x)" ctest --test-dir "$build" -LE gpu --output-on-failure -j "$(nproc)"
grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|Skipped|^dstrain |^pytorch |tok/s" "$log" | tail -40
head -24 "$results"/profile_1b.md "$results"/profile_moe.md 2>/dev/null
cat "$results"/grouped_experts.txt "$results"/fp8.txt "$results"/recompute_gpu.txt \
  "$results"/pipeline_schedules_cpu.txt 2>/dev/null
printf '%s\n' "${summary[@]}"
