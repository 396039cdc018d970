"""Checks on the device machine before the study: torch sees the GPU, the library's CUDA path runs
on the harness's shapes (bfloat16 / float16), and selection_variants' `paper` rule equals the numpy
model of docs/ALGORITHM.md (sparse_reference) on random data.

    FLASHPREFILL_LIB=... python3 accuracy/device_smoke.py
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import selection_variants                     # noqa: E402
import sparse_reference                       # noqa: E402
from attention import load_flashprefill       # noqa: E402


def main():
    import torch
    print(f"torch {torch.__version__}, numpy {np.__version__}, cuda {torch.cuda.is_available()}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else '-'}", flush=True)
    fp = load_flashprefill()
    print("flashprefill", None if fp is None else fp.version(), flush=True)
    rng = np.random.default_rng(0)
    L, hq, hkv, d = 2048, 9, 3, 64
    q = rng.standard_normal((L, hq, d), dtype=np.float32) * 2.0
    k = rng.standard_normal((L, hkv, d), dtype=np.float32)
    v = rng.standard_normal((L, hkv, d), dtype=np.float32)
    k[:, :, :8] += 3.0 * np.sin(np.arange(L) / 200.0)[:, None, None]     # some block structure
    for bs in (64, 128):
        for corr in (True, False):
            ref, rs = sparse_reference.prefill(q, k, v, block_size=bs, alpha=0.1, mean_correction=corr,
                                               return_stats=True)
            tq, tk, tv = (torch.as_tensor(a, device="cuda") for a in (q, k, v))
            out, ts = selection_variants.prefill(tq, tk, tv, block_size=bs, alpha=0.1,
                                                 mean_correction=corr, return_stats=True)
            diff = float(np.abs(out.cpu().numpy() - ref).max())
            line = (f"bs {bs} corr {corr}: reference density {rs['density']:.4f}, tv-paper "
                    f"{ts['density']:.4f} (max abs diff {diff:.1e})")
            if fp is not None:
                for dt in (torch.bfloat16, torch.float16):
                    t0 = time.time()
                    o, st = fp.prefill(tq.to(dt), tk.to(dt), tv.to(dt), block_size=bs, alpha=0.1,
                                       mean_correction=corr, return_stats=True)
                    torch.cuda.synchronize()
                    err = float(np.linalg.norm(o.float().cpu().numpy() - ref) / np.linalg.norm(ref))
                    line += (f"; library {str(dt)[6:]} density {st['density']:.4f} rel L2 vs reference "
                             f"{err:.1e} ({1e3 * (time.time() - t0):.1f} ms)")
            print(line, flush=True)
            assert rs["selected_tiles"] == ts["selected_tiles"] and diff < 1e-4, "tv-paper != reference"
    print("smoke ok", flush=True)


if __name__ == "__main__":
    main()
