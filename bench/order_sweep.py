"""Sweeps the attention kernel's work order (docs/ALGORITHM.md, "Work units") in one process.

The library reads FLASHPREFILL_ATTENTION_HEAD_SECTION and FLASHPREFILL_ATTENTION_LEAD_TILES at
every call, so one process times every order on the same inputs. A spec names an order:
  d      the library's own choice (heuristics.hpp)
  S<n>   n KV heads per section            L<n>   n lead tiles per request (L0: no lead phase)
  e.g. S4L0 = four heads per section, no lead phase.
Rows (best of three CUDA-event medians per spec, specs interleaved so drift hits all alike):
  struct  the demo's structured workload (fp_demo_workload) at 8K / 32K / 128K, index built by the
          library, sparse attention with and without mean correction
  random  L = 32K, random 128x128 block masks at rho 20 / 10 / 5 %, no correction
  dense   L = 8K and 32K, dense mode, with cuDNN (SDPA) timed in the same process
  batch   B = 4 requests of 32K, dense mode, with cuDNN timed in the same process

Usage: python3 bench/order_sweep.py [--lib build/libflashprefill.so] [--specs d,L0,S2,S4,S8]
                                    [--rows struct,random,dense,batch]
"""

import argparse
import os
import re
import sys

import torch
from torch.nn.attention import SDPBackend

import bench_attention as ba
from common import median_ms

ENV_SECTION = "FLASHPREFILL_ATTENTION_HEAD_SECTION"
ENV_LEAD = "FLASHPREFILL_ATTENTION_LEAD_TILES"
SEED = 99


def set_order(spec):
    for key in (ENV_SECTION, ENV_LEAD):
        os.environ.pop(key, None)
    if spec == "d":
        return
    section, lead = re.search(r"S(\d+)", spec), re.search(r"L(\d+)", spec)
    if section is None and lead is None:
        raise SystemExit(f"order_sweep: bad spec {spec!r} (d, S<n>, L<n> or both)")
    if section:
        os.environ[ENV_SECTION] = section.group(1)
    if lead:
        os.environ[ENV_LEAD] = lead.group(1)


def sweep(label, fn, specs, ref_ms=None):
    best = {}
    for _ in range(3):
        for spec in specs:
            set_order(spec)
            best[spec] = min(best.get(spec, float("inf")), median_ms(fn, reps=9))
    set_order("d")
    cells = []
    for spec, t in best.items():
        cells.append(f"{spec}={t:.3f}" + (f"({ref_ms / t:.3f}x cuDNN)" if ref_ms else ""))
    ref = f" cudnn={ref_ms:.3f}" if ref_ms else ""
    print(f"{label}{ref} " + " ".join(cells), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libflashprefill.so")
    ap.add_argument("--specs", default="d,L0,S2,S4,S8,S1L0,S4L0")
    ap.add_argument("--rows", default="struct,random,dense")
    args = ap.parse_args()
    specs = args.specs.split(",")
    rows = set(args.rows.split(","))
    lib = ba.Lib(args.lib)
    torch.manual_seed(SEED)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(SEED)
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  times in ms", flush=True)

    if "struct" in rows:
        for L in (8192, 32768, 131072):
            q, k, v = ba.structured_workload(lib, L)
            b = ba.Batch([L], [L], q, k, v)
            ours = ba.Ours(lib, b)
            for corr in (1, 0):
                build = ours.build_index(lib.config(correction=corr))
                build()
                torch.cuda.synchronize()
                sweep(f"struct L={L} correction={corr} density={ours.density():.4f}", ours.sparse,
                      specs)
            del b, ours, q, k, v
            torch.cuda.empty_cache()

    if "random" in rows:
        L = 32768
        b = ba.Batch([L], [L])
        ours = ba.Ours(lib, b)
        for rho in (0.2, 0.1, 0.05):
            density = ours.use_block_mask(ba.random_block_mask(L, rho, gen), 0)
            sweep(f"random rho={rho} density={density:.4f}", ours.sparse, specs)
        del b, ours
        torch.cuda.empty_cache()

    if "dense" in rows:
        for L in (8192, 32768):
            b = ba.Batch([L], [L])
            ours = ba.Ours(lib, b)
            ref = min(median_ms(ba.sdpa(b, SDPBackend.CUDNN_ATTENTION)) for _ in range(2))
            sweep(f"dense L={L}", ours.dense, specs, ref)
            del b, ours
            torch.cuda.empty_cache()

    if "batch" in rows:
        L = 32768
        b = ba.Batch([L] * 4, [L] * 4)
        ours = ba.Ours(lib, b)
        ref = min(median_ms(ba.sdpa(b, SDPBackend.CUDNN_ATTENTION, requests=4)) for _ in range(2))
        sweep(f"batch B=4 L={L}", ours.dense, specs, ref)
        del b, ours
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
