#!/usr/bin/env bash
# The GPU study of docs/ACCURACY.md ("On the GPU"), run on the device machine from the folder that
# accuracy/device_stage.sh staged (call 2): the library's sweep and the torch selection variants run
# side by side on the one GPU, each stopping at its time budget (language-model windows first, then
# needles depth by depth). Writes $OUT/gpu-fp.jsonl, $OUT/gpu-tv.jsonl and their logs.
#
#   bash .devacc/accuracy/device_run.sh            # PART0 (default /tmp/fpm/part0.npz), BUDGET (300 s)
set -u
cd "$(dirname "$0")/.."
export FLASHPREFILL_LIB=$PWD/lib/libflashprefill.so LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
[ -e model/part0.npz ] || ln -s "${PART0:-/tmp/fpm/part0.npz}" model/part0.npz
test -s model/part0.npz || { echo "model/part0.npz missing: run call 1 first" >&2; exit 3; }
budget=${BUDGET:-300}
R="python3 accuracy/run.py --model model --tokens model/tokens.npz"
$R --lengths 2048 4096 8192 --alphas 0 0.05 0.1 0.2 0.4 --block-sizes 64 128 --layer-errors \
   --time-budget "$budget" --out "$OUT/gpu-fp.jsonl" > "$OUT/fp.log" 2>&1 &
$R --backend tv-paper tv-rownorm tv-perhead tv-oracle --lengths 2048 4096 8192 \
   --alphas 0.02 0.05 0.1 0.2 0.4 --corrections on --needle-kinds --time-budget "$budget" \
   --out "$OUT/gpu-tv.jsonl" > "$OUT/tv.log" 2>&1 &
wait
tail -n 3 "$OUT/fp.log" "$OUT/tv.log"
wc -l "$OUT"/*.jsonl
