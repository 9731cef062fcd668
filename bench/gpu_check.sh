#!/usr/bin/env bash
# The batched engine on a GPU machine: correctness on CUDA, then a throughput / latency sweep.
#
#   bash bench/gpu_check.sh                                    # CUDA, 256..4096 concurrent sessions
#   DEVICE=cpu SWEEP="16 64" SECONDS_PER_POINT=2 bash bench/gpu_check.sh    # the same lines on a CPU
#
# Needs only python3 with torch, numpy, onnx and onnxruntime (the package need not be installed:
# the repository root goes on PYTHONPATH); installs nothing. Loads the shipped model
# (runtime/assets/flash, weights rebuilt from the INT4 graph). Steps:
#   1. correctness: 24 different requests decoded in one batch give, token for token, the lines
#      each gives alone (fp32 must match exactly; the bf16 agreement is reported)
#   2. the single-stream client engine's tokens/s on this machine's CPU (the baseline)
#   3. closed-loop sweep: SWEEP concurrent sessions, SECONDS_PER_POINT each, eager and (CUDA)
#      with CUDA graphs; lines/s, tokens/s, x client, e2e / ttft percentiles, inter-token latency
# Prints one summary table; with OUT set writes $OUT/gpu_check.json and $OUT/gpu_check.txt.
# Stays under BUDGET_S (default 150 s) by skipping sweep points; hard stop at LIMIT_S (175 s).
# Exit status: 0 when the fp32 correctness check passed, 1 when it failed, 2 when no CUDA device.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
# shellcheck source=bench/device_env.sh
source bench/device_env.sh   # PYTHONPATH, unbuffered output, DEVICE, device_report
SWEEP="${SWEEP:-256 512 1024 2048 4096}"
SECS="${SECONDS_PER_POINT:-3}"
BUDGET="${BUDGET_S:-150}"
LIMIT="${LIMIT_S:-175}"

echo "== gpu_check $(date -u +%FT%TZ) device=$DEVICE sweep=[$SWEEP] ${SECS}s/point"
device_report || exit 2

args=(--device "$DEVICE" --check --sweep $SWEEP --seconds "$SECS" --client-seconds 4 --budget-s "$BUDGET")
[ "$DEVICE" = "cuda" ] && args+=(--graphs)
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  args+=(--json "$OUT/gpu_check.json")
  timeout --signal=INT --kill-after=5 "$LIMIT" python3 -u bench/serve_bench.py "${args[@]}" 2>&1 | tee "$OUT/gpu_check.txt"
else
  timeout --signal=INT --kill-after=5 "$LIMIT" python3 -u bench/serve_bench.py "${args[@]}" 2>&1
fi
rc=${PIPESTATUS[0]}
echo "== gpu_check done rc=$rc"
exit "$rc"
