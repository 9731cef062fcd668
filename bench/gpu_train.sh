#!/usr/bin/env bash
# The shipped model's training run, made to fit one call on a GPU machine lent for a fixed time:
# train the Flash model from scratch on the line book and pack its weights to come back.
#
#   OUT=/some/dir BOOK=v4 bash bench/gpu_train.sh               # CUDA, ~400 s of training, book v4
#   DEVICE=cpu TRAIN_ARGS=--tiny TRAIN_BUDGET_S=20 OUT=/tmp/g bash bench/gpu_train.sh   # smoke run here
#
# Needs python3 with torch, numpy, onnx, pyyaml and tqdm (the package need not be installed: the
# repository root goes on PYTHONPATH); installs nothing, downloads nothing. Steps:
#   1. `flashnpc train --device $DEVICE --budget-s $TRAIN_BUDGET_S`: the book expanded, a tokenizer
#      trained on it, then STEPS (an upper bound) cut to what fits the budget, timed over the first
#      steps (train.py `steps_for_budget`); QAT over the last QAT_FRACTION of the cut schedule
#   2. the checkpoint without its optimizer state (~40 MB), tarred and split into 15 MB parts
#      ($OUT/ckpt.tar.part00, 01, ...) + $OUT/train.json + $OUT/gpu_train.txt: at most 8 files of
#      16 MB, what a device call brings back. Back here: `cat ckpt.tar.part* | tar -x -C runs/`,
#      `flashnpc export onnx --model runs/ckpt --out runs/gpu_export` (the export stamps this
#      machine's onnxruntime), then `flashnpc eval` and `flashnpc eval blind --versus`.
# Exit status: 0 when the model trained and was packed, 1 when a step failed, 2 when no CUDA device.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
# shellcheck source=bench/device_env.sh
source bench/device_env.sh   # PYTHONPATH, unbuffered output, DEVICE, device_report
OUT="${OUT:-runs/gpu_train}"
BUDGET="${TRAIN_BUDGET_S:-400}"
STEPS="${STEPS:-60000}"
BATCH="${BATCH:-128}"
CONFIG="${CONFIG:-{\"lr\": 2e-3, \"min_lr\": 2e-4, \"warmup_steps\": 300, \"qat_fraction\": 0.3, \"eval_interval\": 1000, \"checkpoint_interval\": 1000000}}"
WORK="${WORK:-$(mktemp -d)}"
BOOK="${BOOK:-default}"   # default: the book as it is; v4: runtime/assets/compose_v4.yaml in place of its patterns
mkdir -p "$OUT"
flashnpc() { python3 -c 'import sys; from plugin.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }

{
echo "== gpu_train $(date -u +%FT%TZ) device=$DEVICE budget=${BUDGET}s steps<=$STEPS batch=$BATCH book=$BOOK"
echo "== config $CONFIG ${TRAIN_ARGS:-}"
device_report || exit 2
t0=$(date +%s)
book_args=()
if [ "$BOOK" = "v4" ]; then
  # the book draws the v3.1 patterns the shipped model was trained on: a copy with book v4's patterns
  python3 -c 'import sys; from runtime.factory.linebook import book_with_compose; book_with_compose(sys.argv[1])' "$WORK/book" || exit 1
  book_args=(--line-book "$WORK/book")
fi
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
flashnpc train --device "$DEVICE" --out "$WORK/run" --steps "$STEPS" --batch-size "$BATCH" "${book_args[@]}" \
  --budget-s "$BUDGET" --config "$CONFIG" --quiet --json ${TRAIN_ARGS:-} > "$OUT/train.json" || exit 1
t1=$(date +%s)
python3 - "$OUT/train.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
f, b = d["final"], d.get("budget") or {}
print(f"trained: {f['step']} steps (asked {b.get('steps_asked')}, step {b.get('step_s', 0) * 1e3:.1f} ms), "
      f"val CE fp32 {f['val_ce_fp32']:.4f} int4 {f['val_ce_int4']:.4f}, {f['tokens_per_s_this_run']:.0f} tokens/s, "
      f"{f['wall_s_this_run']:.0f} s in the loop")
PY
# the weights without the optimizer state (~40 MB fp32), in parts a device call brings back
python3 - "$WORK/run" "$WORK/ckpt" <<'PY' || exit 1
import shutil, sys, torch
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True)
ckpt = torch.load(src / "model.pt", map_location="cpu", weights_only=False)
ckpt.pop("optimizer", None)
torch.save(ckpt, dst / "model.pt")
for name in ("tokenizer.json", "config.json", "catalog.json", "train_log.json"):
    shutil.copyfile(src / name, dst / name)
PY
tar -C "$WORK" -cf - ckpt | split -b 15M -d - "$OUT/ckpt.tar.part" || exit 1
t2=$(date +%s)
echo "== gpu_train done: setup+train $((t1 - t0)) s, packing $((t2 - t1)) s; $(ls "$OUT" | tr '\n' ' ')"
echo "== here: cat ckpt.tar.part* | tar -x -C runs/ && flashnpc export onnx --model runs/ckpt --out runs/gpu_export"
} 2>&1 | tee "$OUT/gpu_train.txt"
exit "${PIPESTATUS[0]}"
