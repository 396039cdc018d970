#!/usr/bin/env bash
# The GPU study of docs/ACCURACY.md ("On the GPU") on a machine with a CUDA GPU, from the
# repository root: the library's sweep and the torch selection variants run side by side on the
# GPU, each stopping at its time budget (language-model windows first, then needles depth by depth).
#
#   bash accuracy/device_run.sh
#
# MODEL: the GGUF or a pack from accuracy/device_pack.py (default: accuracy/.device when it holds a
# pack, else the pinned model package); TOKENS: a token pack (default: the pack's tokens.npz, else
# the corpora are tokenized here); FLASHPREFILL_LIB (default build/libflashprefill.so); BUDGET
# (seconds per sweep, 300); OUT (default accuracy/results/gpu). Writes $OUT/gpu-fp.jsonl,
# $OUT/gpu-tv.jsonl and their logs.
set -u
cd "$(dirname "$0")/.."
export FLASHPREFILL_LIB=${FLASHPREFILL_LIB:-$PWD/build/libflashprefill.so}
export PYTHONUNBUFFERED=1
OUT=${OUT:-accuracy/results/gpu}
mkdir -p "$OUT"
args=()
model=${MODEL:-}
[ -z "$model" ] && [ -f accuracy/.device/part0.npz ] && model=accuracy/.device
[ -n "$model" ] && args+=(--model "$model")
tokens=${TOKENS:-}
[ -z "$tokens" ] && [ -n "$model" ] && [ -f "$model/tokens.npz" ] && tokens=$model/tokens.npz
[ -n "$tokens" ] && args+=(--tokens "$tokens")
budget=${BUDGET:-300}
R=(python3 accuracy/run.py "${args[@]}")
"${R[@]}" --lengths 2048 4096 8192 --alphas 0 0.05 0.1 0.2 0.4 --block-sizes 64 128 --layer-errors \
   --time-budget "$budget" --out "$OUT/gpu-fp.jsonl" > "$OUT/fp.log" 2>&1 &
"${R[@]}" --backend tv-paper tv-rownorm tv-perhead tv-oracle --lengths 2048 4096 8192 \
   --alphas 0.02 0.05 0.1 0.2 0.4 --corrections on --needle-kinds --time-budget "$budget" \
   --out "$OUT/gpu-tv.jsonl" > "$OUT/tv.log" 2>&1 &
wait
tail -n 3 "$OUT/fp.log" "$OUT/tv.log"
wc -l "$OUT"/*.jsonl
