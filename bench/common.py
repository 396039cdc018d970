"""What the benchmarks share: the package's ctypes mirrors of the C ABI
(python/flashprefill/_abi.py), loaded by path so that a benchmark uses them without importing the
package, which loads a library of its own choosing (each benchmark loads the one --lib names),
and the CUDA-event timer."""

import ctypes
import importlib.util
import math
import os
import pathlib
import statistics
import time

import torch

_PATH = pathlib.Path(__file__).resolve().parents[1] / "python" / "flashprefill" / "_abi.py"
_spec = importlib.util.spec_from_file_location("flashprefill_abi", _PATH)
_abi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_abi)

Problem, SelectConfig, Index, IndexSizes, Output = (
    _abi.Problem, _abi.SelectConfig, _abi.Index, _abi.IndexSizes, _abi.Output)


last_clock_mhz = None  # the SM clock sampled during median_ms's timed calls (None: unknown)
_nvml = None


def sm_clock_mhz():
    """The current SM clock in MHz through NVML (the driver's libnvidia-ml), or None where it
    cannot be read (no NVML, or CUDA_VISIBLE_DEVICES renumbers the devices)."""
    global _nvml
    if _nvml is None:
        _nvml = False
        if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            try:
                lib = ctypes.CDLL("libnvidia-ml.so.1")
                handle = ctypes.c_void_p()
                if (lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetHandleByIndex_v2(
                        torch.cuda.current_device(), ctypes.byref(handle)) == 0):
                    _nvml = (lib, handle)
            except OSError:
                pass
    if not _nvml:
        return None
    lib, handle = _nvml
    clock = ctypes.c_uint()
    return clock.value if lib.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(clock)) == 0 else None


def median_ms(fn, warmup=3, reps=None, warmup_ms=1000.0, timed_ms=300.0):
    """Median milliseconds per call of fn() in the GPU's steady state, timed with CUDA events.

    1. Warm-up: fn() runs back to back for at least `warmup` calls and `warmup_ms` milliseconds.
       The H200 runs at its power limit (~690 W) under attention, and its SM clock follows the
       limiter's running average of the power (a ~1 s window): a call timed within a second of
       an idle or lighter stretch (a benchmark's setup, FlexAttention) runs at a higher clock
       than it keeps (docs/PERF.md, "Steady-state timing").
    2. Timing: `reps` calls (default: enough for `timed_ms` milliseconds, 15 to 400), each
       between its own pair of events, queued without synchronizing in between, so that the
       host's launch work for a call overlaps the previous call on the GPU (as in a serving
       loop or a CUDA graph); a call whose host work outlasts the previous call's GPU time
       still pays for it. The median over a few hundred milliseconds evens out the clock's
       moves under the limiter.
    """
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    while done < warmup or (time.perf_counter() - start) * 1e3 < warmup_ms:
        fn()
        done += 1
        if done % 4 == 0:
            torch.cuda.synchronize()  # keeps the warm-up's wall time equal to its GPU time
    torch.cuda.synchronize()
    if reps is None:
        per_call_ms = (time.perf_counter() - start) * 1e3 / done
        reps = max(15, min(400, math.ceil(timed_ms / per_call_ms)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    global last_clock_mhz
    last_clock_mhz = sm_clock_mhz()  # the queue is still running: the clock under this load
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


def latency_ms(fn, warmup=3, reps=15):
    """Median milliseconds of fn() called on an idle GPU: each call between a pair of events and
    followed by a synchronization, so the host's launch work is on the clock. This was
    median_ms's method before 2026-11-30's steady-state timing; kept for the latency column."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)
