"""Index-stage benchmark: fp_build_index on CUDA against torch SDPA dense causal attention.

B = 1, Hq = 32, Hkv = 8, D = 128, bf16, L_q = L_kv = L for L in 8K .. 128K, default selection
config (block 128, alpha 0.1, sink 256, window 512, recent 1, mean correction on). The index
stage is called through the C ABI with plain ctypes (torch tensors' data_ptr() and the current
stream) and timed two ways with CUDA events: eager calls and replays of a captured CUDA graph.
The baselines, run in the same process on the same inputs: SDPA with the cuDNN backend and with
the FLASH backend (K/V expanded to 32 heads). Every timing is common.median_ms: the median of
event-timed calls queued back to back after at least a second of the same calls (the GPU's
steady state). Prints a table; writes the rows to --json and the run's results file (command,
date, machine, commit, rows) into --results. --device cpu runs the library's CPU reference
without the graph replay and the CUDA baselines (a smoke run of the code paths).

Usage: python3 bench/bench_index.py [--lib build/libflashprefill.so] [--lengths 8192,...]
                                    [--json rows.json] [--results bench/results] [--device cpu]
"""

import argparse
import ctypes
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

import common
from common import median_ms, Problem, SelectConfig, Index, IndexSizes


FP_DEVICE_CPU, FP_DEVICE_CUDA, FP_BFLOAT16, FP_KV_CONTIGUOUS = 0, 1, 1, 0


def load(path):
    lib = ctypes.CDLL(path)
    lib.fp_last_error_message.restype = ctypes.c_char_p
    for name in ("fp_index_sizes_query", "fp_build_index_workspace_size", "fp_build_index"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"{what}: status {status}: {lib.fp_last_error_message().decode()}")


def bench_length(lib, length, hq=32, hkv=8, d=128, reps=20):
    on_cuda = common.DEVICE == "cuda"
    dev = torch.device(common.DEVICE)
    q = torch.randn(length, hq, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(length, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(length, hkv, d, device=dev, dtype=torch.bfloat16)
    cu = torch.tensor([0, length], device=dev, dtype=torch.int32)

    p = Problem()
    p.device, p.dtype, p.batch_size = (FP_DEVICE_CUDA if on_cuda else FP_DEVICE_CPU), FP_BFLOAT16, 1
    p.num_heads_q, p.num_heads_kv, p.head_dim = hq, hkv, d
    p.q, p.q_stride_token, p.q_stride_head = q.data_ptr(), q.stride(0), q.stride(1)
    p.total_q, p.cu_seqlens_q, p.max_seqlen_q = length, cu.data_ptr(), length
    p.kv_layout, p.k, p.v = FP_KV_CONTIGUOUS, k.data_ptr(), v.data_ptr()
    p.k_stride_token, p.k_stride_head = k.stride(0), k.stride(1)
    p.v_stride_token, p.v_stride_head = v.stride(0), v.stride(1)
    p.max_seqlen_k, p.total_k, p.cu_seqlens_k = length, length, cu.data_ptr()
    cfg = SelectConfig(128, 0.1, 256, 512, 1, 1)

    sizes = IndexSizes()
    check(lib, lib.fp_index_sizes_query(ctypes.byref(p), ctypes.byref(cfg), ctypes.byref(sizes)),
          "sizes")
    ws_bytes = ctypes.c_size_t()
    check(lib, lib.fp_build_index_workspace_size(ctypes.byref(p), ctypes.byref(cfg),
                                                 ctypes.byref(ws_bytes)), "workspace")
    cu_out = torch.empty(sizes.num_segments + 1, device=dev, dtype=torch.int32)
    idx = torch.empty(sizes.idx_capacity, device=dev, dtype=torch.int32)
    k_mean = torch.empty(sizes.mean_elements, device=dev, dtype=torch.float32)
    v_mean = torch.empty(sizes.mean_elements, device=dev, dtype=torch.float32)
    ws = torch.empty(max(ws_bytes.value, 1), device=dev, dtype=torch.uint8)
    index = Index(cu_out.data_ptr(), idx.data_ptr(), k_mean.data_ptr(), v_mean.data_ptr(),
                  sizes.idx_capacity)

    def build(config=cfg):
        if on_cuda:
            p.stream = torch.cuda.current_stream().cuda_stream
        check(lib, lib.fp_build_index(ctypes.byref(p), ctypes.byref(config), ctypes.byref(index),
                                      ctypes.c_void_p(ws.data_ptr()),
                                      ctypes.c_size_t(ws_bytes.value)), "build_index")

    eager = median_ms(build, 3, reps)
    # Breakdown: alpha = 0 skips the scoring products (every candidate is selected), and
    # mean_correction = 0 skips pooling V; the differences to the full call isolate both.
    variants = {}
    for name, changed in (("no_scoring", SelectConfig(128, 0.0, 256, 512, 1, 1)),
                          ("no_v_pool", SelectConfig(128, 0.1, 256, 512, 1, 0))):
        variants[name] = median_ms(lambda: build(changed), 3, reps)
    if on_cuda:
        torch.cuda.synchronize()
    selected = int(cu_out[-1].item())
    tiles = sizes.max_q_tiles
    causal = sum(min((((i + 1) * 128 - 1) // (hq // hkv)) // 64 + 1, (length + 63) // 64)
                 for i in range(tiles)) * hkv
    replay = None
    if on_cuda:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            build()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            build()
        replay = median_ms(graph.replay, 3, reps)

    qt = q.unsqueeze(0).transpose(1, 2).contiguous()
    kt = k.unsqueeze(0).transpose(1, 2).repeat_interleave(hq // hkv, dim=1).contiguous()
    vt = v.unsqueeze(0).transpose(1, 2).repeat_interleave(hq // hkv, dim=1).contiguous()
    dense_reps = 5 if length >= 65536 else 10
    baselines = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                baselines[name] = median_ms(
                    lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), 2,
                    dense_reps)
        except RuntimeError as err:  # a backend that refuses the shape is reported, not fatal
            print(f"L={length}: SDPA {name} failed: {str(err).splitlines()[0][:120]}", flush=True)
            baselines[name] = None
    flops = 4.0 * hq * d * length * (length + 1) / 2
    cudnn = baselines["cudnn"]
    return {
        "row": "index", "L": length, "index_eager_ms": eager, "index_graph_ms": replay,
        "cudnn_ms": cudnn, "flash_ms": baselines["flash"],
        "cudnn_tflops": None if cudnn is None else flops / cudnn / 1e9,
        "ratio_vs_cudnn": None if cudnn is None or replay is None else replay / cudnn,
        "density": selected / causal,
        "index_no_scoring_ms": variants["no_scoring"], "index_no_v_pool_ms": variants["no_v_pool"],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default="build/libflashprefill.so")
    parser.add_argument("--lengths", default="8192,16384,32768,65536,131072")
    parser.add_argument("--json", default=None, help="write the rows alone to this file")
    parser.add_argument("--results", default=None, metavar="DIR",
                        help="write the run's results file into DIR, e.g. bench/results")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    started = common.utc_now()
    common.DEVICE = args.device
    common.load_package(args.lib)
    lib = load(args.lib)
    torch.seed()
    print(f"device: {common.machine()}, torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)
    rows = []
    results = common.ResultsFile(args.results, "index", started) if args.results else None
    for length in (int(x) for x in args.lengths.split(",")):
        rows.append(bench_length(lib, length))
        if results:
            results.write(rows)
        print(json.dumps(rows[-1]), flush=True)
        if common.DEVICE == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if results:
        print("results:", results.write(rows, complete=True))
    print(f"{'L':>7} {'index eager':>12} {'index graph':>12} {'no scoring':>11} {'no V pool':>10} "
          f"{'cuDNN dense':>12} {'FA dense':>10} {'cuDNN TF/s':>10} {'index/cuDNN':>11} "
          f"{'density':>8}")

    def ms(value, width, digits):
        return f"{'-':>{width}}" if value is None else f"{value:>{width - 2}.{digits}f}ms"

    for r in rows:
        ratio, tf = r["ratio_vs_cudnn"], r["cudnn_tflops"]
        print(f"{r['L']:>7} {ms(r['index_eager_ms'], 12, 3)} {ms(r['index_graph_ms'], 12, 3)} "
              f"{ms(r['index_no_scoring_ms'], 11, 3)} {ms(r['index_no_v_pool_ms'], 10, 3)} "
              f"{ms(r['cudnn_ms'], 12, 2)} {ms(r['flash_ms'], 10, 2)} "
              f"{'-' if tf is None else f'{tf:.0f}':>10} "
              f"{'-' if ratio is None else f'{100 * ratio:.2f}%':>11} {r['density']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
