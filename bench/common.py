"""What the benchmarks share: the package's ctypes mirrors of the C ABI
(python/flashprefill/_abi.py), loaded by path so that a benchmark uses them without importing the
package, which loads a library of its own choosing (each benchmark loads the one --lib names),
and the CUDA-event timer."""

import importlib.util
import pathlib
import statistics

import torch

_PATH = pathlib.Path(__file__).resolve().parents[1] / "python" / "flashprefill" / "_abi.py"
_spec = importlib.util.spec_from_file_location("flashprefill_abi", _PATH)
_abi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_abi)

Problem, SelectConfig, Index, IndexSizes, Output = (
    _abi.Problem, _abi.SelectConfig, _abi.Index, _abi.IndexSizes, _abi.Output)


def median_ms(fn, warmup=3, reps=15):
    """Median milliseconds of fn() over reps runs after warmup runs, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
