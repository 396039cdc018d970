#!/usr/bin/env bash
# The SGLang backend's CPU tests: a virtual environment with SGLang 0.5.23 installed --no-deps (its
# full install pins CUDA-only packages), torch, and the pure-Python modules SGLang's attention,
# forward-batch and memory-pool code import; then python/tests/test_sglang_*.py against the CPU
# library. Usage: bash scripts/test_sglang.sh [--prepare] [build-dir]   (the CPU library must be
# built there; scripts/setup.sh builds it; --prepare: make the environment, run nothing).
# VENV=path picks the environment (default .venv-sglang). Installs with uv (scripts/lib/uv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=0
if [ "${1:-}" = --prepare ]; then prepare=1; shift; fi
BUILD_DIR=${1:-build}
VENV=${VENV:-.venv-sglang}

# torch's PyPI wheel is its CUDA build, the version of the test environment and of the vLLM test's
# (requirements/test.txt, scripts/test_vllm.sh: one download for all three). Installed --no-deps
# it loads on a machine whose CUDA 13 toolkit provides the common CUDA libraries; the four below
# are the ones that toolkit lacks or has too old. When torch still does not import, its full
# dependency set is installed instead.
TORCH="torch==2.13.0"
TORCH_LIBS="nvidia-nccl-cu13==2.29.7 nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.1
nvidia-nvshmem-cu13==3.4.5 triton==3.7.1"
# SGLang and what `import sglang.srt...` needs on the CPU, each pinned, all --no-deps.
SGLANG_DEPS="sglang==0.5.23 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.11 attrs==26.1.0 certifi==2026.10.19.post1
charset-normalizer==3.5.3 click==8.5.1 compressed-tensors==0.20.1 dill==0.4.1 einops==0.8.2
filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 gguf==0.19.0 h11==0.16.0 hf-xet==1.8.0
httpcore2==2.16.2 httpcore==1.0.9 httpx2==2.16.2 httpx==0.28.1 huggingface-hub==1.33.0 idna==3.20
iniconfig==2.3.1 ipython==9.18.1 jinja2==3.1.6 loguru==0.7.3 markdown-it-py==4.3.0
markupsafe==3.0.4 mdurl==0.1.2 ml-dtypes==0.6.0 mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1
networkx==3.6.1 numpy==2.4.6 openai==3.57.0 orjson==3.13.0 packaging==26.4
partial-json-parser==0.2.1.1.post7 pillow==13.0.0 pluggy==1.7.0 propcache==0.5.4 psutil==7.2.2
pybase64==1.5.1 pydantic-core==2.50.5 pydantic==2.14.4 pygments==2.21.0 pytest==9.2.0 pyyaml==6.0.4
pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2 rich==15.0.0 safetensors==0.8.0
sentencepiece==0.2.3 shellingham==1.5.4 sniffio==1.3.1 starlette==1.10.0 sympy==1.14.0
tokenizers==0.23.2 torchvision==0.28.0 tqdm==4.70.1 traitlets==5.16.1 transformers==5.19.0
truststore==0.10.5 typer==0.29.2 typing-extensions==4.16.0 typing-inspection==0.4.5 urllib3==2.8.0
yarl==1.25.1"

start=$(date +%s)
# shellcheck source=scripts/lib/uv.sh
. scripts/lib/uv.sh
uv_ready
PY="$VENV/bin/python"
pip_install() { uv_install "$VENV" "$@"; }
if ! "$PY" -c "import torch, sglang" 2>/dev/null; then
  pip_install --no-deps $TORCH $TORCH_LIBS $SGLANG_DEPS
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "test_sglang: torch does not load on this machine's CUDA libraries; installing its" \
         "dependencies from PyPI"
    pip_install $TORCH
  fi
fi
echo "test_sglang: environment ready in $(( $(date +%s) - start )) s"
[ "$prepare" = 0 ] || exit 0

PYTHONPATH=python FLASHPREFILL_LIB="$BUILD_DIR/libflashprefill.so" \
  "$PY" -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
  python/tests/test_sglang_layout.py python/tests/test_sglang_backend.py
echo "test_sglang: done in $(( $(date +%s) - start )) s"
