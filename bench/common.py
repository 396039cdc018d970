"""What the benchmarks share: the package (flashprefill, on the library that --lib names), the
ctypes mirrors of the C ABI it defines, the steady-state timer, and the results file of a run.

The timed calls go straight through ctypes to the library under test: a run may time several
builds of the library in one process (tools/compare_builds.py), and the time of a call must be the
library's alone, not the package's per-call checks. Everything else (block-mask indexes, pooled
means) comes from the package.
"""

import ctypes
import datetime
import importlib.util
import json
import math
import os
import pathlib
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
fp = None  # the flashprefill package, once load_package() has run
DEVICE = "cuda"  # where the benchmark runs; "cpu" makes the timers plain wall-clock ones


def load_package(lib_path):
    """Imports flashprefill on the library at lib_path (FLASHPREFILL_LIB), the repository's own
    python/ first, and returns the package."""
    global fp
    os.environ["FLASHPREFILL_LIB"] = str(pathlib.Path(lib_path).resolve())
    if (REPO / "python" / "flashprefill").is_dir():
        sys.path.insert(0, str(REPO / "python"))
    import flashprefill
    fp = flashprefill
    return fp


def _struct_mirrors():
    """The package's _abi.py (ctypes mirrors of the C structs), loaded by path: it loads no
    library, so the mirrors are there before load_package() has picked one."""
    path = REPO / "python" / "flashprefill" / "_abi.py"
    spec = importlib.util.spec_from_file_location("flashprefill_abi", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_mirrors = _struct_mirrors()
Problem, SelectConfig, Index, IndexSizes, Output = (
    _mirrors.Problem, _mirrors.SelectConfig, _mirrors.Index, _mirrors.IndexSizes, _mirrors.Output)


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
       than it keeps (docs/PERF.md, "How times are taken").
    2. Timing: `reps` calls (default: enough for `timed_ms` milliseconds, 15 to 400), each
       between its own pair of events, queued without synchronizing in between, so that the
       host's launch work for a call overlaps the previous call on the GPU (as in a serving
       loop or a CUDA graph); a call whose host work outlasts the previous call's GPU time
       still pays for it. The median over a few hundred milliseconds evens out the clock's
       moves under the limiter.
    """
    if DEVICE != "cuda":
        return _host_median_ms(fn, warmup, reps)
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


def _host_median_ms(fn, warmup, reps):
    """median_ms on the CPU (a smoke run of the benchmark's code paths): wall-clock times of a
    few calls, no steady-state warm-up."""
    for _ in range(min(warmup, 1)):
        fn()
    times = []
    for _ in range(min(reps or 3, 3)):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def latency_ms(fn, warmup=3, reps=15):
    """Median milliseconds of fn() called on an idle GPU: each call between a pair of events and
    followed by a synchronization, so the host's launch work is on the clock (the latency
    column of the sparse rows)."""
    if DEVICE != "cuda":
        return _host_median_ms(fn, warmup, reps)
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


def _git(*args):
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine():
    """What the run ran on: the GPU's name, or the CPU's."""
    if DEVICE == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


class ResultsFile:
    """One run's results file, DIRECTORY/<date>-<machine>-<bench>.json: the exact command, the
    date, the machine, the commit ($FP_COMMIT, else git, else "unknown") and every row.
    write(rows) rewrites it whole, so a run stopped part way (a time limit) leaves the rows it
    measured. bench/report.py renders docs/PERF.md from these files."""

    def __init__(self, directory, bench, started):
        self.record = {
            "bench": bench,
            "command": shlex.join(["python3", os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
            "date": started.isoformat(timespec="seconds"),
            "machine": machine(),
            "commit": os.environ.get("FP_COMMIT") or _git("rev-parse", "HEAD") or "unknown",
            "tree": None,
            "library": fp.version() if fp is not None else None,
            "torch": torch.__version__,
            "complete": False,
            "rows": [],
        }
        # With FP_COMMIT given, the checkout's git (if any) describes another commit: its status
        # says nothing of the tree that ran.
        status = None if os.environ.get("FP_COMMIT") else _git("status", "--porcelain",
                                                                "--untracked-files=no")
        if status is not None:
            self.record["tree"] = "modified" if status else "clean"
        slug = re.sub(r"[^a-z0-9]+", "-", self.record["machine"].lower()).strip("-")[:40]
        self.path = (pathlib.Path(directory) /
                     f"{started.strftime('%Y-%m-%dT%H%MZ')}-{slug}-{bench}.json")
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, rows, complete=False):
        self.record["rows"] = rows
        self.record["complete"] = complete
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1) + "\n")
        tmp.replace(self.path)
        return self.path


def reporter(rows, results):
    """report(row): appends the row to `rows`, rewrites the results file (when there is one) and
    prints the row as key=value pairs."""
    def report(row):
        rows.append(row)
        if results:
            results.write(rows)
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in row.items()), flush=True)
    return report


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)
