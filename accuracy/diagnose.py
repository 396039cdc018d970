"""Where the prefill error comes from, per layer, on the model's real activations.

Runs the dense model (transformers, hf_model.Capture) over a text window of the prompt pack,
keeps q/k/v of every layer, and for one selection
configuration measures over all query rows (PackGQA tiles, docs/ALGORITHM.md):
- rho_pr: the exact softmax mass of the pruned blocks (Eq. 9), mean over rows;
- recovered: the surrogate mass sum_J |B_J| e^{s_bar_J} of the corrected blocks divided by their exact
  mass sum_J sum_i e^{s_i} (Eq. 6 vs Eq. 7: 1 means the zero-order term is exact, < 1 is the AM-GM gap);
- sink_share: the exact mass of key 0 alone, and its share predicted by the pooled score of block 0.

With --check-library it also compares flashprefill.prefill with sparse_reference.prefill (the numpy
model of docs/ALGORITHM.md) on the captured q/k/v of every fifth layer.

    python3 accuracy/diagnose.py --length 2048 --alpha 0.1 [--check-library]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_model                                            # noqa: E402
import sparse_reference                                    # noqa: E402
import tasks                                               # noqa: E402
from sparse_reference import LOG2E, Q_TILE_ROWS, _pool     # noqa: E402


def layer_stats(q, k, alpha, bs, sink_tokens=256, window_tokens=512, dense_recent_tiles=1):
    lq, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    scale = 1.0 / math.sqrt(d)
    n_blocks = -(-lq // bs)
    start = np.arange(n_blocks) * bs
    end = np.minimum(start + bs, lq)
    rows = g * lq
    n_tiles = -(-rows // Q_TILE_ROWS)
    pruned_share, recovered_num, recovered_den, sink_true, sink_pred = [], 0.0, 0.0, [], []
    for h in range(hkv):
        qp = q[:, h * g:(h + 1) * g].reshape(rows, d).astype(np.float64)
        kh = k[:, h].astype(np.float64)
        k_mean = _pool(k[:, h], bs, n_blocks).astype(np.float64)
        pos = np.arange(rows) // g
        for tile in range(n_tiles - dense_recent_tiles):
            r0, r1 = tile * Q_TILE_ROWS, min((tile + 1) * Q_TILE_ROWS, rows)
            p = pos[r0:r1]
            first, last = p[0], p[-1]
            cand = start <= last
            x = qp[r0:r1] @ k_mean.T * scale * LOG2E
            valid = start[None, :] <= p[:, None]
            e = np.where(valid, np.exp2(x - np.max(np.where(valid, x, -np.inf))), 0).sum(0)
            sel = cand & ((e >= alpha * e.max()) | (start < sink_tokens)
                          | (end - 1 >= first - window_tokens) | (end - 1 >= first))
            s = qp[r0:r1] @ kh[:last + 1].T * scale
            s = np.where(np.arange(last + 1)[None, :] <= p[:, None], s, -np.inf)
            m = s.max(1, keepdims=True)
            w = np.exp(s - m)
            total = w.sum(1)
            block_mass = np.stack([w[:, a:b].sum(1) for a, b in zip(start[cand], end[cand])], 1)
            pruned = ~sel[cand]
            pruned_share.append((block_mass[:, pruned].sum(1) / total).mean())
            fix = cand & ~sel & (end - 1 <= first)
            if fix.any():
                surrogate = (end[fix] - start[fix]) * np.exp(qp[r0:r1] @ k_mean[fix].T * scale - m)
                recovered_num += surrogate.sum()
                recovered_den += block_mass[:, fix[cand]].sum()
            sink_true.append((w[:, 0] / total).mean())
            sink_pred.append((e[0] / e.sum()))
    return {"rho_pr": float(np.mean(pruned_share)),
            "recovered": recovered_num / recovered_den if recovered_den else float("nan"),
            "sink_share": float(np.mean(sink_true)), "block0_pooled_share": float(np.mean(sink_pred))}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--text", default="kjv")
    p.add_argument("--gguf")
    p.add_argument("--prompts", default=os.path.join(HERE, ".pack", "prompts.npz"))
    p.add_argument("--check-library", action="store_true")
    args = p.parse_args()
    import torch

    model, _ = hf_model.load(args.gguf)
    capture = hf_model.Capture()
    model.set_attn_implementation(capture.NAME)
    prompt = next(x for x in tasks.load_pack(args.prompts) if len(x.tokens) == args.length
                  and x.name.startswith(f"text/{args.text}/"))
    with torch.no_grad():
        model.model(input_ids=torch.as_tensor(prompt.tokens[None]))
    captured = {layer: tuple(t.numpy() for t in qkv) for layer, qkv in capture.qkv.items()}
    print(f"| layer | pruned mass rho_pr | surrogate / exact mass of corrected blocks | key-0 mass | "
          f"block-0 pooled share |\n| ---: | ---: | ---: | ---: | ---: |")
    for layer, (q, k, _) in sorted(captured.items()):
        s = layer_stats(q, k, args.alpha, args.block_size)
        print(f"| {layer} | {s['rho_pr']:.3f} | {s['recovered']:.3f} | {s['sink_share']:.3f} | "
              f"{s['block0_pooled_share']:.3f} |", flush=True)
    if not args.check_library:
        return
    library = hf_model.flashprefill_module().prefill
    print("\n| layer | correction | density library | density reference | max abs diff | relative L2 |\n"
          "| ---: | --- | ---: | ---: | ---: | ---: |")
    for layer in range(0, len(captured), 5):
        q, k, v = captured[layer]
        for correction in (True, False):
            kw = dict(alpha=args.alpha, block_size=args.block_size, mean_correction=correction,
                      return_stats=True)
            lib, lib_stats = library(q, k, v, **kw)
            ref, ref_stats = sparse_reference.prefill(q, k, v, **kw)
            print(f"| {layer} | {'on' if correction else 'off'} | {lib_stats['density']:.4f} | "
                  f"{ref_stats['density']:.4f} | {np.abs(lib - ref).max():.1e} | "
                  f"{np.linalg.norm(lib - ref) / np.linalg.norm(ref):.1e} |", flush=True)


if __name__ == "__main__":
    main()
