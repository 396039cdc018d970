"""Host cost per call of the Python entry points, beside torch SDPA in the same process.

For each path (the functional API as a new user calls it, the functional API with device
metadata and maxima given, the torch custom op, Plan.run, torch SDPA) this times the host side
of single calls: perf_counter around each call, median over --calls calls after warm-up, with
the GPU queue drained between bursts so that no call waits for a full launch queue. On CUDA it
also times the GPU side of back-to-back calls with CUDA events (median of --repeats bursts) for
the dense path through Plan.run, the torch op and a direct ctypes call of fp_dense_attention
with a prebuilt problem (the C-level time): their ratio is what the Python layer costs the GPU.

    python3 bench/bench_host.py --device cuda --seqlen 8192 --results bench/results
    python3 bench/bench_host.py --device cpu --seqlen 256

Writes one JSON file (command, date, machine, rows) when --results is given; prints a table.
"""

import argparse
import ctypes
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import flashprefill as fp  # noqa: E402
import flashprefill.torch  # noqa: E402,F401 - registers torch.ops.flashprefill
from flashprefill import _lib  # noqa: E402


def host_us(fn, calls, sync):
    """Median host microseconds of one call of fn(), in bursts of 16 with the queue drained."""
    times = []
    for _ in range(3):
        fn()
    sync()
    while len(times) < calls:
        for _ in range(16):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        sync()
    return statistics.median(times)


def gpu_ms(fn, repeats, burst=20):
    """Median GPU milliseconds per call over bursts of back-to-back calls (CUDA events)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(burst):
            fn()
        stop.record()
        stop.synchronize()
        per_call.append(start.elapsed_time(stop) / burst)
    return statistics.median(per_call)


def direct_dense(plan, q, k, v, out):
    """fp_dense_attention through ctypes with the plan's problem, filled once: no Python layer
    beyond the foreign call itself."""
    plan.run(q, k, v, out=out)  # fills the plan's problem, output and workspace
    call = _lib.lib.fp_dense_attention
    args = (*plan._call_args, plan._workspace.ptr, plan._workspace.nbytes)
    return lambda: call(*args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seqlen", type=int, default=None,
                        help="tokens of the one request (default 8192 on CUDA, 256 on the CPU)")
    parser.add_argument("--heads", default="32,8", help="Hq,Hkv")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--results", default=None, help="folder for the JSON results file")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    seqlen = args.seqlen or (8192 if cuda else 256)
    heads_q, heads_kv = (int(x) for x in args.heads.split(","))
    dim = args.head_dim
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    gen = torch.Generator(device=device).manual_seed(int(time.time()))
    q = torch.randn(seqlen, heads_q, dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(seqlen, heads_kv, dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(seqlen, heads_kv, dim, device=device, dtype=dtype, generator=gen)
    cu = torch.tensor([0, seqlen], dtype=torch.int32, device=device)
    meta = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seqlen, max_seqlen_k=seqlen)
    out = torch.empty_like(q)
    ops = torch.ops.flashprefill
    dense_plan = fp.Plan(heads_q, heads_kv, dim, dtype, device, cu, seqlen, seqlen,
                         cu_seqlens_k=cu, dense=True)
    sparse_plan = fp.Plan(heads_q, heads_kv, dim, dtype, device, cu, seqlen, seqlen,
                          cu_seqlens_k=cu)
    qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # SDPA's [1, H, L, D]

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                                enable_gqa=True)

    paths = {
        "sdpa": sdpa,
        "dense: functional, defaults": lambda: fp.dense_attention(q, k, v),
        "dense: functional, device metadata": lambda: fp.dense_attention(
            q, k, v, validate_metadata=False, out=out, **meta),
        "dense: torch op": lambda: ops.dense_attention_out(q, k, v, out, **meta,
                                                           validate_metadata=False),
        "dense: Plan.run": lambda: dense_plan.run(q, k, v, out=out),
        "prefill: functional, defaults": lambda: fp.prefill(q, k, v),
        "prefill: torch op": lambda: ops.prefill_out(q, k, v, out, **meta,
                                                     validate_metadata=False),
        "prefill: Plan.run": lambda: sparse_plan.run(q, k, v, out=out),
        "build_index: functional, defaults": lambda: fp.build_index(q, k, v),
    }
    rows = []
    for name, fn in paths.items():
        rows.append({"path": name, "host_us": host_us(fn, args.calls, sync)})
        print(f"{name:40s} host {rows[-1]['host_us']:9.1f} us", flush=True)
    if cuda:
        kernel = gpu_ms(direct_dense(dense_plan, q, k, v, out), args.repeats)
        for name in ("dense: Plan.run", "dense: torch op", "dense: functional, defaults"):
            ms = gpu_ms(paths[name], args.repeats)
            rows.append({"path": name, "gpu_ms": ms, "c_level_gpu_ms": kernel,
                         "ratio_to_c_level": ms / kernel})
            print(f"{name:40s} GPU {ms:8.3f} ms per call, {ms / kernel:.3f}x the C-level "
                  f"{kernel:.3f} ms", flush=True)
    result = {
        "bench": "host", "command": " ".join(["python3"] + sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": torch.cuda.get_device_name(device) if cuda else platform.processor() or
        platform.machine(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() or "unknown",
        "shape": {"seqlen": seqlen, "heads_q": heads_q, "heads_kv": heads_kv, "head_dim": dim,
                  "dtype": str(dtype), "device": str(device)},
        "rows": rows,
    }
    if args.results:
        folder = pathlib.Path(args.results)
        folder.mkdir(parents=True, exist_ok=True)
        tag = "cuda" if cuda else "cpu"
        path = folder / f"{result['date'].replace(':', '')}-{tag}-host.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
