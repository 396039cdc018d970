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
phases=${*:-"breakdown needles rules"}
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
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
python3 accuracy/report.py "$out"/*.jsonl --tables "$out/tables.md" --plot "$out/frontier.png"
