"""Where the density goes: which rule selects each tile, and which block sets the threshold.

Runs the dense model (transformers) over text windows, keeps every layer's q, k and v, and for the
paper's selection (Eq. 19-20 with the forced rules, selection_variants.Geometry) attributes every
selected 64-key tile to the first rule that keeps it, in the order
recent tile (the tile runs dense) > sink > diagonal > window > threshold (kept by
`E_J >= alpha * E_max` alone). For the threshold it also says which block holds E_max in each
non-recent query tile: a sink block, the diagonal block, another window block, or a free block.
The selected tiles it counts are checked against the library's index (flashprefill.build_index)
on the same q/k/v.

    python3 accuracy/breakdown.py --lengths 2048 4096 8192 --alphas 0.05 0.1 0.4 --out x.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_model                                   # noqa: E402
import selection_variants as sv                   # noqa: E402
import tasks                                      # noqa: E402

RULE_ORDER = ("recent", "sink", "diagonal", "window", "threshold")
EMAX_HOLDERS = ("sink", "diagonal", "window", "free")


def layer_breakdown(q, k, alpha, block_size=128, sink_tokens=256, window_tokens=512,
                    dense_recent_tiles=1):
    """q [L, Hq, D], k [L, Hkv, D] float32 torch tensors (one request) -> dict of counts:
    selected tiles per rule (RULE_ORDER), causal tiles, and per EMAX_HOLDERS the number of
    non-recent query tiles whose E_max block is of that kind."""
    import torch
    L, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    geo = sv.Geometry(L, g, block_size, sink_tokens, window_tokens, dense_recent_tiles, q.device)
    counts = dict.fromkeys(RULE_ORDER, 0)
    holders = dict.fromkeys(EMAX_HOLDERS, 0)
    recent = geo.recent[:, None].expand(geo.nt, geo.nb)
    for h in range(hkv):
        qp = q[:, h * g:(h + 1) * g, :].reshape(geo.rows, d)
        _, xm = geo.scores(qp, sv._pool(k[:, h, :], block_size, geo.nb), 1.0 / math.sqrt(d))
        energy = sv.energies(xm)
        sel = sv.select("paper", geo, energy, alpha)
        taken = torch.zeros_like(sel)
        for rule, mask in (("recent", recent), ("sink", geo.sink), ("diagonal", geo.diagonal),
                           ("window", geo.window), ("threshold", sel)):
            mine = sel & mask & ~taken
            counts[rule] += int((geo.block_tiles * mine).sum())
            taken |= mine
        top = energy.masked_fill(~geo.cand, float("-inf")).argmax(1)           # [nt]
        rows = torch.arange(geo.nt, device=q.device)
        kind = torch.where(geo.sink[rows, top], 0,
                           torch.where(geo.diagonal[rows, top], 1,
                                       torch.where(geo.window[rows, top], 2, 3)))
        kind = kind[~geo.recent]
        for i, name in enumerate(EMAX_HOLDERS):
            holders[name] += int((kind == i).sum())
    counts["causal"] = geo.causal_tiles * hkv
    return counts, holders


def library_selected_tiles(fp, q, k, v, alpha, block_size=128, sink_tokens=256, window_tokens=512,
                           dense_recent_tiles=1):
    """Selected tiles of the library's index on the same q/k (cu[-1])."""
    config = fp.SelectConfig(block_size=block_size, alpha=alpha, sink_tokens=sink_tokens,
                             window_tokens=window_tokens, dense_recent_tiles=dense_recent_tiles)
    index = fp.build_index(q.contiguous(), k.contiguous(), v.contiguous(), config=config)
    return int(index.cu[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf")
    p.add_argument("--prompts", default=os.path.join(HERE, ".pack", "prompts.npz"))
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.1, 0.4])
    p.add_argument("--texts", nargs="+", default=["kjv", "code"])
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--out", required=True, help="JSON lines file (appended)")
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    model, _ = hf_model.load(args.gguf, device, dtype)
    fp = hf_model.flashprefill_module()
    capture = hf_model.Capture()
    model.set_attn_implementation(capture.NAME)
    prompts = tasks.load_pack(args.prompts)
    command = "python3 accuracy/breakdown.py " + " ".join(sys.argv[1:] if argv is None else argv)
    for length in args.lengths:
        for text in args.texts:
            prompt = next(x for x in prompts if len(x.tokens) == length
                          and x.name.startswith(f"text/{text}/"))
            capture.qkv.clear()
            with torch.no_grad():
                model.model(input_ids=torch.as_tensor(prompt.tokens[None], device=device))
            for alpha in args.alphas:
                per_layer = []
                for layer, qkv in sorted(capture.qkv.items()):
                    q, k, v = (t.to(device) for t in qkv)
                    counts, holders = layer_breakdown(q, k, alpha)
                    if device == "cuda":   # the library's CUDA path: the model's bfloat16 values
                        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
                    counts["library_selected"] = library_selected_tiles(fp, q, k, v, alpha)
                    per_layer.append({"layer": layer, **counts,
                                      **{f"emax_{n}": v for n, v in holders.items()}})
                record = {"length": length, "prompt": prompt.name, "alpha": alpha,
                          "layers": per_layer, "command": command,
                          "device": f"{device} ({dtype})", "date": datetime.datetime.now(
                              datetime.timezone.utc).isoformat(timespec="seconds")}
                with open(args.out, "a") as f:
                    f.write(json.dumps(record) + "\n")
                total = {r: sum(x[r] for x in per_layer) for r in RULE_ORDER}
                causal = sum(x["causal"] for x in per_layer)
                sel = sum(total.values())
                lib = sum(x["library_selected"] for x in per_layer)
                emax = {n: sum(x[f"emax_{n}"] for x in per_layer) for n in EMAX_HOLDERS}
                n_tiles = sum(emax.values())
                print(f"[{length}] {prompt.name} alpha {alpha:g}: density {sel / causal:.3f} "
                      f"(library {lib / causal:.3f}); "
                      + ", ".join(f"{r} {total[r] / sel:.3f}" for r in RULE_ORDER)
                      + "; E_max in " + ", ".join(f"{n} {emax[n] / n_tiles:.3f}"
                                                   for n in EMAX_HOLDERS), flush=True)


if __name__ == "__main__":
    main()
