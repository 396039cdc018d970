"""Times two or more builds of the library on the same rows, one build per process call.

Each call loads one library, runs the chosen row groups on inputs drawn from a fixed seed (so
every build sees the same q/k/v and the same block masks) and times cuDNN in the same process:
compare builds by their ratios to that baseline or by their times, from calls made back to back
in one device session. Rows:
  dense   L = 8K, 32K, 128K: ours vs cuDNN (SDPA), with the relative L2 error against cuDNN.
  sparse  L = 32K, random 128x128 block masks at rho 50/20/10/5 %, with and without mean
          correction: time and time / (density x our dense time).
  batch   B = 4 at 32K and the mixed batch with cached prefixes, dense.

Usage: python3 bench/compare_builds.py NAME=path/to/libflashprefill.so [dense,sparse,batch]
"""

import sys

import torch
from torch.nn.attention import SDPBackend

import bench_attention as ba
from common import median_ms

SEED = 1234


def best_of(fn, rounds=2):
    return min(median_ms(fn) for _ in range(rounds))


def poisoned_then_timed(batch, fn):
    """One call into a NaN-poisoned output (is every element written and finite?), then the time."""
    finite = bool(torch.isfinite(batch.poisoned_run(fn)).all())
    return finite, best_of(fn)


def dense_rows(name, lib):
    for L in (8192, 32768, 131072):
        b = ba.Batch([L], [L])
        ours = ba.Ours(lib, b)
        ref = ba.sdpa(b, SDPBackend.CUDNN_ATTENTION)().transpose(1, 2).reshape(L, ba.HQ, ba.D)
        err = ba.rel_err(b.poisoned_run(ours.dense), ref)
        t, t_cudnn = best_of(ours.dense), best_of(ba.sdpa(b, SDPBackend.CUDNN_ATTENTION))
        print(f"dense L={L} {name}={t:.4f}ms ({ba.tflops(b, t):.0f} TFLOP/s, {t_cudnn / t:.3f}x cuDNN)"
              f" cudnn={t_cudnn:.4f}ms err={err:.2e}", flush=True)
        del b, ours, ref
        torch.cuda.empty_cache()


def sparse_rows(name, lib, gen):
    L = 32768
    b = ba.Batch([L], [L])
    ours = ba.Ours(lib, b)
    t_dense = best_of(ours.dense)
    for rho in (0.5, 0.2, 0.1, 0.05):
        mask = ba.random_block_mask(L, rho, gen)
        for corr in (0, 1):
            density = ours.use_block_mask(mask, corr)
            finite, t = poisoned_then_timed(b, ours.sparse)
            print(f"sparse rho={rho} correction={corr} density={density:.4f} {name}={t:.4f}ms"
                  f" ratio={t / (density * t_dense):.3f} finite={finite}", flush=True)


def batch_rows(name, lib):
    for len_q, len_kv in (([32768] * 4, [32768] * 4),
                          ([2048, 512, 8192, 1024], [32768, 16384, 8192, 65536])):
        b = ba.Batch(len_q, len_kv)
        ours = ba.Ours(lib, b)
        finite, t = poisoned_then_timed(b, ours.dense)
        print(f"batch len_q={len_q} len_kv={len_kv} {name}={t:.4f}ms ({ba.tflops(b, t):.0f} TFLOP/s)"
              f" finite={finite}", flush=True)
        del b, ours
        torch.cuda.empty_cache()


def main():
    name, path = sys.argv[1].split("=", 1)
    groups = sys.argv[2].split(",") if len(sys.argv) > 2 else ["dense", "sparse", "batch"]
    lib = ba.Lib(path)
    torch.manual_seed(SEED)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(SEED)
    if "dense" in groups:
        dense_rows(name, lib)
    if "sparse" in groups:
        sparse_rows(name, lib, gen)
    if "batch" in groups:
        batch_rows(name, lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
