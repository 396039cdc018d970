#!/usr/bin/env bash
# The SGLang backend's CPU tests: a virtual environment with SGLang 0.5.23 installed --no-deps (its
# full install pins CUDA-only packages), torch, and the pure-Python modules SGLang's attention,
# forward-batch and memory-pool code import; then python/tests/test_sglang_*.py against the CPU
# library. Usage: bash scripts/test_sglang.sh [build-dir]   (the CPU library must be built there;
# scripts/setup.sh builds it). VENV=path picks the environment (default .venv-sglang).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
VENV=${VENV:-.venv-sglang}

# torch's PyPI wheel is its CUDA build. Installed --no-deps it loads on a machine whose CUDA 13
# toolkit provides the common CUDA libraries; the four below are the ones that toolkit lacks or
# has too old. When torch still does not import, its full dependency set is installed instead.
TORCH="torch==2.14.1"
TORCH_LIBS="nvidia-nccl-cu13==2.30.7 nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.1
nvidia-nvshmem-cu13==3.4.5 triton==3.8.0"
# SGLang and what `import sglang.srt...` needs on the CPU, each pinned, all --no-deps.
SGLANG_DEPS="sglang==0.5.23 transformers==5.19.0 tokenizers==0.23.2 huggingface-hub==1.33.0
safetensors==0.8.0 compressed-tensors==0.18.0 apache-tvm-ffi==0.1.11 torchvision==0.29.2
numpy==2.4.6 ml-dtypes==0.6.0 filelock==4.3.1 fsspec==2026.9.0 jinja2==3.1.6 markupsafe==3.0.4
mpmath==1.3.0 networkx==3.6.1 sympy==1.14.0 typing-extensions==4.16.0 packaging==26.4
orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 urllib3==2.8.0 idna==3.20
certifi==2026.10.19.post1 charset-normalizer==3.5.3 pillow==13.0.0 starlette==1.10.0
anyio==4.16.0 sniffio==1.3.1 msgspec==0.23.0 pydantic==2.14.4 pydantic-core==2.50.5
typing-inspection==0.4.5 annotated-types==0.8.0 pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1
traitlets==5.16.1 pygments==2.21.0 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1
propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 regex==2026.11.19
pyyaml==6.0.4 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 dill==0.4.1 sentencepiece==0.2.3
loguru==0.7.3 gguf==0.19.0 einops==0.8.1 openai==2.8.0 distro==1.9.0 jiter==0.12.0
pytest==9.2.0 pluggy==1.6.0 iniconfig==2.3.0"

start=$(date +%s)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
pip_install() { "$PY" -m pip install -q --disable-pip-version-check --no-compile "$@"; }
if ! "$PY" -c "import torch" 2>/dev/null; then
  pip_install --no-deps $TORCH $TORCH_LIBS
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "test_sglang: torch does not load on this machine's CUDA libraries; installing its" \
         "dependencies from PyPI"
    pip_install $TORCH
  fi
fi
"$PY" -c "import sglang" 2>/dev/null || pip_install --no-deps $SGLANG_DEPS
echo "test_sglang: environment ready in $(( $(date +%s) - start )) s"

PYTHONPATH=python FLASHPREFILL_LIB="$BUILD_DIR/libflashprefill.so" \
  "$PY" -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
  python/tests/test_sglang_layout.py python/tests/test_sglang_backend.py
echo "test_sglang: done in $(( $(date +%s) - start )) s"
