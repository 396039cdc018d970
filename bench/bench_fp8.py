"""FP8 e4m3 benchmark: the library's e4m3 attention beside its bf16 path and torch baselines.

B = 1, Hq = 32, Hkv = 8, D = 128, causal. Inputs are random normal bf16 q/k/v, quantized per
tensor to e4m3 (c = max |x| / 448, value = c * e4m3; docs/ALGORITHM.md "FP8 e4m3"); the bf16
rows and the baselines run on the dequantized inputs rounded to bf16, so that every row computes
the same attention. Calls go through the C ABI with ctypes as in bench_attention.py (whose Batch,
Ours, timers and baselines this reuses); the descales are device float32 scalars.

Rows:
  fp8_dense   L in --lengths: e4m3 dense mode vs our bf16 dense mode, SDPA cuDNN and FLASH (FA2),
              TFLOP/s counting causal FLOPs; err_vs_cudnn: relative L2 distance of the e4m3
              output to cuDNN's on the same (dequantized) inputs.
  fp8_sparse  L in --sparse-lengths, rho in --rhos: e4m3 sparse mode on a random 128x128 block
              mask (diagonal forced), no mean correction, against rho x e4m3 dense (the goal:
              within 1.15x).
  fp8_prefill L = --prefill-length: the whole e4m3 prefill (index stage on the e4m3 inputs, then
              the sparse operator; the default config, mean correction on) on the demo's
              structured workload with its queries scaled so that the bf16 selection keeps
              --prefill-density (5 %) of the causal tiles (as bench_attention.py's
              demo_q_scaled), vs our bf16 prefill on the dequantized inputs and FA2 and cuDNN
              dense; once with e4m3 q/k/v and once with a bf16 q over the e4m3 K/V (q_dtype
              bf16: the library quantizes q, c_q = max|q| / 448 per KV head).

--device cpu runs the rows on the library's CPU reference (the baselines left out): a smoke run
of the code paths at small lengths, not a measurement.

Usage: python3 bench/bench_fp8.py [--lib build/libflashprefill.so] [--results bench/results]
"""

import argparse
import ctypes
import sys

import torch
from torch.nn.attention import SDPBackend

import bench_attention as ba
import common
from common import median_ms

FP_FLOAT8_E4M3 = 3
E4M3_MAX = 448.0


def quantize(x):
    """(e4m3 tensor, float32 descale scalar on x's device, dequantized bf16 tensor) of x."""
    c = (x.float().abs().amax() / E4M3_MAX).clamp_min(1e-12)
    q8 = (x.float() / c).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q8, c.reshape(1).to(torch.float32), (q8.float() * c).to(torch.bfloat16)


class Fp8Batch:
    """The e4m3 twin of a bf16 ba.Batch: its problem reads e4m3 q/k/v with per-tensor descales
    and writes bf16 into the batch's output (`batch`, whose bf16 q/k/v are the dequantized
    inputs, which the block-mask indexes pool); `dequantized` is the bf16 Batch on the same
    inputs (the bf16 rows and the baselines run on it)."""

    def __init__(self, q, k, v, kv_cache=False):
        L = q.shape[0]
        (self.q8, self.cq, qd), (self.k8, self.ck, kd), (self.v8, self.cv, vd) = (
            quantize(t) for t in (q, k, v))
        if kv_cache:  # a bf16 q over the e4m3 cache: the library quantizes q (dynamic c_q)
            qd = q.to(torch.bfloat16)
        self.dequantized = ba.Batch([L], [L], qd, kd, vd)
        self.batch = ba.Batch([L], [L], qd, kd, vd)  # its problem becomes the e4m3 one
        p = self.batch.problem
        p.k, p.v = self.k8.data_ptr(), self.v8.data_ptr()
        p.k_descale, p.v_descale = self.ck.data_ptr(), self.cv.data_ptr()
        p.out_dtype = ba.FP_BF16
        if kv_cache:
            p.kv_dtype = FP_FLOAT8_E4M3
        else:
            p.dtype = FP_FLOAT8_E4M3
            p.q, p.q_descale = self.q8.data_ptr(), self.cq.data_ptr()


def dense_rows(args, lib, report):
    for L in [int(x) for x in args.lengths.split(",")]:
        x = [torch.randn(L, h, ba.D, device=ba.DEV, dtype=torch.bfloat16)
             for h in (ba.HQ, ba.HKV, ba.HKV)]
        f = Fp8Batch(*x)
        ours8, ours16 = ba.Ours(lib, f.batch), ba.Ours(lib, f.dequantized)
        out8 = f.batch.poisoned_run(ours8.dense)
        t8 = median_ms(ours8.dense)
        clock = common.last_clock_mhz
        t16 = median_ms(ours16.dense)
        base = {name: ba.try_ms(ba.sdpa(f.dequantized, backend)) for name, backend in
                (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION))}
        row = dict(row="fp8_dense", L=L, fp8_ms=t8, bf16_ms=t16, cudnn_ms=base["cudnn"],
                   fa2_ms=base["fa2"], fp8_tflops=ba.tflops(f.batch, t8),
                   bf16_tflops=ba.tflops(f.batch, t16), fp8_vs_bf16=t16 / t8,
                   finite=bool(torch.isfinite(out8).all()),
                   err_vs_cudnn=ba.reference_error(f.dequantized, out8), clock_mhz=clock)
        for name in ("cudnn", "fa2"):
            if base[name] is not None:
                row[f"speedup_vs_{name}"] = base[name] / t8
        report(row)
        del f, ours8, ours16, x
        ba.empty_cache()


def sparse_rows(args, lib, gen, report):
    for L in [int(x) for x in args.sparse_lengths.split(",")]:
        x = [torch.randn(L, h, ba.D, device=ba.DEV, dtype=torch.bfloat16)
             for h in (ba.HQ, ba.HKV, ba.HKV)]
        f = Fp8Batch(*x)
        ours8 = ba.Ours(lib, f.batch)
        t_dense = median_ms(ours8.dense)
        for rho in [float(r) for r in args.rhos.split(",")]:
            mask = ba.random_block_mask(L, rho, gen)
            density = ours8.use_block_mask(mask, 0)
            finite = bool(torch.isfinite(f.batch.poisoned_run(ours8.sparse)).all())
            t = median_ms(ours8.sparse)
            report(dict(row="fp8_sparse", L=L, rho=rho, density=density, correction=0,
                        fp8_ms=t, fp8_dense_ms=t_dense,
                        ratio_to_rho_dense=t / (density * t_dense), finite=finite,
                        clock_mhz=common.last_clock_mhz))
        del f, ours8, x
        ba.empty_cache()


def prefill_rows(args, lib, report):
    """The whole prefill, e4m3 q/k/v and a bf16 q over the e4m3 cache, beside our bf16 prefill
    on the same (dequantized) inputs and the dense baselines."""
    L = args.prefill_length
    q, k, v = ba.structured_workload(lib, L)
    b = ba.Batch([L], [L], q.clone(), k, v)
    ours16 = ba.Ours(lib, b)
    cfg = lib.config(alpha=0.1, correction=1)
    scale = ba.calibrate_q_scale(ours16, b, q, cfg, args.prefill_density)
    for kv_cache in (False, True):
        f = Fp8Batch(q * scale, k, v, kv_cache=kv_cache)
        ours8, bf16 = ba.Ours(lib, f.batch), ba.Ours(lib, f.dequantized)
        build8, build16 = ours8.build_index(cfg), bf16.build_index(cfg)

        def prefill():
            build8()
            ours8.sparse()

        def prefill16():
            build16()
            bf16.sparse()
        out8 = f.batch.poisoned_run(prefill)
        density = ours8.density()
        t_index, t_attn = median_ms(build8), median_ms(ours8.sparse)
        t_total = median_ms(prefill)
        out16 = f.dequantized.poisoned_run(prefill16)
        t16 = median_ms(prefill16)
        base = {name: ba.try_ms(ba.sdpa(f.dequantized, backend)) for name, backend in
                (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION))}
        row = dict(row="fp8_prefill", workload="demo_q_scaled", L=L, q_scale=scale,
                   q_dtype="bf16" if kv_cache else "e4m3", density=density,
                   target_density=args.prefill_density, correction=1, index_ms=t_index,
                   attn_ms=t_attn, total_ms=t_total, bf16_total_ms=t16,
                   fp8_vs_bf16=t16 / t_total, fa2_ms=base["fa2"], cudnn_ms=base["cudnn"],
                   finite=bool(torch.isfinite(out8).all()),
                   err_vs_dense=ba.reference_error(f.dequantized, out8),
                   bf16_err_vs_dense=ba.reference_error(f.dequantized, out16))
        for name in ("fa2", "cudnn"):
            if base[name] is not None:
                row[f"speedup_vs_{name}"] = base[name] / t_total
        report(row)
        del f, ours8, bf16, build8, build16, out8, out16
        ba.empty_cache()


def main():
    started = common.utc_now()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libflashprefill.so")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="write the run's results file into DIR, e.g. bench/results")
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--sparse-lengths", default="131072")
    ap.add_argument("--rhos", default="0.1,0.05")
    ap.add_argument("--prefill-length", type=int, default=131072)
    ap.add_argument("--prefill-density", type=float, default=0.05)
    ap.add_argument("--skip", default="", help="comma list of row groups (dense, sparse, prefill)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: the rows on the library's CPU reference, without the CUDA "
                         "baselines (a smoke run of the code paths at small lengths)")
    args = ap.parse_args()
    ba.DEV = common.DEVICE = args.device
    skip = set(args.skip.split(",")) if args.skip else set()
    common.load_package(args.lib)
    lib = ba.Lib(args.lib)
    torch.manual_seed(0)
    gen = torch.Generator(device=ba.DEV)
    gen.manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    rows = []
    results = common.ResultsFile(args.results, "fp8", started) if args.results else None
    print(f"# {common.machine()}  torch {torch.__version__}", flush=True)
    report = common.reporter(rows, results)
    failed = False
    for name, fn in (("dense", lambda: dense_rows(args, lib, report)),
                     ("sparse", lambda: sparse_rows(args, lib, gen, report)),
                     ("prefill", lambda: prefill_rows(args, lib, report))):
        if name in skip:
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one failing group must not hide the others
            failed = True
            print(f"row={name}  failed={type(e).__name__}: {str(e).splitlines()[0][:160]}",
                  flush=True)
        ba.empty_cache()
    if results:
        print("results:", results.write(rows, complete=not failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
