#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh machine, then configures and builds.
# Idempotent: reruns skip what is already there. Usage: bash scripts/setup.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}

CUTLASS_VERSION=4.2.0.0
CUTLASS_SHA256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
PY_REQUIREMENTS="numpy==2.4.6 pytest==9.2.0 ml-dtypes==0.6.0"

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# CUTLASS / CuTe headers from the pinned PyPI wheel, hash-checked, into an ignored folder.
if [ ! -f third_party/cutlass/include/cute/tensor.hpp ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$CUTLASS_VERSION"
  wheel=$(ls "$tmp"/nvidia_cutlass-*.whl)
  echo "$CUTLASS_SHA256  $wheel" | sha256sum -c --quiet
  rm -rf third_party/cutlass && mkdir -p third_party/cutlass
  python3 - "$wheel" third_party/cutlass <<'PY'
import sys, zipfile, pathlib
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = dest / "include" / name[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(name))
PY
  rm -rf "$tmp"
fi

python3 -c "import numpy, pytest, ml_dtypes" 2>/dev/null || python3 -m pip install -q $PY_REQUIREMENTS

cuda_flag=()
[ -n "${FP_ENABLE_CUDA:-}" ] && cuda_flag=(-DFP_ENABLE_CUDA="$FP_ENABLE_CUDA")
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flag[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
