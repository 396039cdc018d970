#!/usr/bin/env bash
# The CPU part of the study of docs/ACCURACY.md (float32), sized for a 2-core machine: each phase
# appends to its own JSON lines file under accuracy/results/cpu/, then the report. The full study
# (108 needles a length, every rule) is accuracy/gpu_study.sh, on a GPU.
#
#   bash accuracy/study.sh [phase ...]         # default: every phase
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
export FLASHPREFILL_LIB=${FLASHPREFILL_LIB:-build/libflashprefill.so}
out=accuracy/results/cpu
mkdir -p "$out"
[ -f accuracy/.pack/prompts.npz ] || python3 accuracy/make_prompts.py
phases=${*:-"breakdown needles rules fp8"}
for phase in $phases; do
  case $phase in
    # which rule selects the tiles, on one KJV window a length
    breakdown) nice -n 10 python3 accuracy/breakdown.py --lengths 2048 4096 8192 --alphas 0.02 0.1 0.4 \
                 --texts kjv --out "$out/breakdown.jsonl" ;;
    # 2K needles (the first of the pack: each kind at depths 0.1 and 0.2) and one KJV window,
    # dense vs the library's default, in one batch
    needles) nice -n 10 python3 accuracy/run.py --lengths 2048 --needles "${NEEDLES:-6}" --windows 1 \
               --texts kjv --alphas 0.1 --batch 7 --mix-kinds --out "$out/needles.jsonl" ;;
    # the rules on that window (the library's alpha 0.1 is the needles phase's); freemax keeps
    # far more at a given alpha, so it gets larger ones
    rules) nice -n 10 python3 accuracy/run.py --lengths 2048 --needles 0 --windows 1 --texts kjv \
             --alphas 0.02 --rules paper freemax topp oracle --rule-alphas 0.02 0.2 \
             --out "$out/rules.jsonl"
           nice -n 10 python3 accuracy/run.py --lengths 2048 --needles 0 --windows 1 --texts kjv \
             --alphas --rules paper freemax --rule-alphas 0.005 0.5 0.8 --out "$out/rules.jsonl" ;;
    # FP8 e4m3 Q/K/V (per-tensor descales) beside bfloat16 q/k/v at the paper's alpha and at
    # alpha 0 (each precision's floor), corrected and not, on the KJV window and the first three
    # needles, one prompt a batch; the model's float32 beside them on the window
    fp8) nice -n 10 python3 accuracy/run.py --lengths 2048 --needles 3 --windows 1 --texts kjv \
           --alphas 0.1 0 --corrections on off --attn-dtypes float8_e4m3 bfloat16 \
           --time-budget "${FP8_BUDGET:-4200}" --out "$out/fp8.jsonl"
         nice -n 10 python3 accuracy/run.py --lengths 2048 --needles 0 --windows 1 --texts kjv \
           --alphas 0.1 --corrections on off --out "$out/fp8-float32.jsonl" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
python3 accuracy/report.py "$out"/*.jsonl --tables "$out/tables.md" --plot "$out/frontier.png"
