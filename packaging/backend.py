"""The PEP 517 backend of flashprefill: scikit-build-core, plus the CUTLASS/CuTe headers' wheel as
a build requirement when the CUDA backend will be built.

CMake enables CUDA when it finds nvcc (FP_ENABLE_CUDA=ON/OFF in the environment or as
`-C cmake.define.FP_ENABLE_CUDA=...` decides instead); the header-only CUTLASS wheel is needed
only then, so a CPU-only install downloads nothing it does not use.
"""

import os
import shutil

from scikit_build_core import build as _build
from scikit_build_core.build import *  # noqa: F401,F403 - the hooks this module does not wrap

CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0.0"


def _cuda_wanted(config_settings):
    setting = (config_settings or {}).get("cmake.define.FP_ENABLE_CUDA",
                                          os.environ.get("FP_ENABLE_CUDA", ""))
    if str(setting).upper() in ("ON", "1", "TRUE", "YES"):
        return True
    if str(setting).upper() in ("OFF", "0", "FALSE", "NO"):
        return False
    cudacxx = os.environ.get("CUDACXX")
    return bool(cudacxx and os.path.exists(cudacxx)) or shutil.which("nvcc") is not None \
        or os.path.exists("/usr/local/cuda/bin/nvcc")


def _with_cutlass(requires, config_settings):
    return [*requires, CUTLASS_REQUIREMENT] if _cuda_wanted(config_settings) else list(requires)


def get_requires_for_build_wheel(config_settings=None):
    return _with_cutlass(_build.get_requires_for_build_wheel(config_settings), config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _with_cutlass(_build.get_requires_for_build_editable(config_settings),
                         config_settings)
