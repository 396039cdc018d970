#!/usr/bin/env bash
# The accuracy study of docs/ACCURACY.md, phase by phase (each phase appends to its own JSON lines file
# under accuracy/results/, dense baselines are cached in accuracy/.cache/ (float32 logits, about 100 MB
# a prompt; delete it freely), so an interrupted study
# resumes cheaply), then the report. Sized for a 2-core CPU; on a GPU, pass more (see --help).
#
#   bash accuracy/study.sh [reference|fp] [phase ...]     # default: fp, every phase
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${1:-fp}
shift || true
phases=${*:-"p1 p2 p3 p4 p5 p6 p7 p8 p9"}
out=accuracy/results
mkdir -p "$out"
run() { nice -n 10 python3 accuracy/run.py --backend "$backend" "$@"; }

for phase in $phases; do
  case $phase in
    # 2K: the default and the sparsest alpha, correction on/off; 2 text windows + 6 needles
    p1) run --lengths 2048 --alphas 0.1 0.4 --depths 0.2 0.5 0.8 --layer-errors \
            --out "$out/p1-2k-$backend.jsonl" ;;
    # 8K: the same four configurations on one text window (no per-layer exact re-run: CPU time)
    p2) run --lengths 8192 --alphas 0.1 0.4 --lm-texts kjv --needle-kinds --out "$out/p2-8k-$backend.jsonl" ;;
    # 4K: the same four configurations, one text window and two needles
    p3) run --lengths 4096 --alphas 0.1 0.4 --lm-texts kjv --depths 0.5 --layer-errors \
            --out "$out/p3-4k-$backend.jsonl" ;;
    # 2K: the rest of the alpha sweep at block size 128; 2 text windows + 2 needles
    p4) run --lengths 2048 --alphas 0.05 0.2 --depths 0.5 --layer-errors --out "$out/p4-2k-$backend.jsonl" ;;
    # 2K, block size 64: the whole alpha sweep on one text window
    p5) run --lengths 2048 --block-sizes 64 --alphas 0.05 0.1 0.2 0.4 --lm-texts kjv --needle-kinds \
            --layer-errors --out "$out/p5-2k-bs64-$backend.jsonl" ;;
    # 8K: needles at the default, correction on/off
    p6) run --lengths 8192 --alphas 0.1 --lm-texts --depths 0.5 --out "$out/p6-8k-needle-$backend.jsonl" ;;
    # 2K: alphas below the issue's sweep, to find where top-1 agreement reaches 99 %
    p7) run --lengths 2048 --alphas 0.01 0.001 --depths 0.5 --layer-errors --out "$out/p7-2k-small-alpha-$backend.jsonl" ;;
    # more needles at the default (correction on/off): 2K at ten depths, 4K at five, both kinds
    p8) run --lengths 2048 --alphas 0.1 --lm-texts --depths 0.05 0.15 0.25 0.35 0.45 0.55 0.65 0.75 0.85 0.95 \
            --out "$out/p8-2k-needles-$backend.jsonl" ;;
    p9) run --lengths 4096 --alphas 0.1 --lm-texts --depths 0.1 0.3 0.7 0.9 --out "$out/p9-4k-needles-$backend.jsonl" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
# The CPU study's plot stays beside its results; docs/accuracy_vs_alpha.png is the GPU study's
# (docs/ACCURACY.md gives its report command).
python3 accuracy/report.py "$out"/*.jsonl --out "$out"
