"""The package's ctypes mirrors of the C ABI (python/flashprefill/_abi.py) for the benchmarks,
loaded by path so that a benchmark shares them without importing the package, which loads a
library of its own choosing; each benchmark loads the library it is told to (--lib)."""

import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).resolve().parents[1] / "python" / "flashprefill" / "_abi.py"
_spec = importlib.util.spec_from_file_location("flashprefill_abi", _PATH)
_abi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_abi)

Problem, SelectConfig, Index, IndexSizes, Output = (
    _abi.Problem, _abi.SelectConfig, _abi.Index, _abi.IndexSizes, _abi.Output)
