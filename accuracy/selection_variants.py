"""Torch variants of flashprefill's block selection, to measure what the selection *rule* costs.

Not the library, and nothing here changes it: `--backend tv-<rule>` runs the model with one of these
rules in every layer (float32, on the GPU) so that rules can be compared at equal density. Every
rule keeps the library's structure of docs/ALGORITHM.md — 128-row query tiles, whole `block_size`
blocks, the forced sink / window / diagonal / recent blocks, the threshold `E_J >= alpha * max E`
and the Eq. 6 mean correction of unselected fully visible blocks — and differs only in the energy
`E_J` the threshold is applied to:

| rule | tile rows | E_J |
| --- | --- | --- |
| `paper` | PackGQA (the g heads of a KV head, token-major), as the library | sum_r exp(x_rJ - M), M the tile's max (Eq. 19-20) |
| `rownorm` | PackGQA | sum_r softmax_J(x_rJ): every row's pooled distribution counts equally |
| `perhead` | 128 tokens of one query head (no GQA sharing) | as `paper` |
| `oracle` | PackGQA | sum_r of the row's exact softmax mass in block J (what the pooled score estimates) |

with x_rJ = q_r . k_mean_J * scale. Statistics: `density` counts 64-key tiles like the library
(selected / causal tiles of the tile grid); `pair_density` counts the causal (query row, key) pairs
computed, comparable across rules whose tile grids differ (`perhead`).

`prefill(..., rule="paper")` reproduces sparse_reference.prefill (the numpy model of the contract);
accuracy/device_smoke.py checks that on the device.
"""

from __future__ import annotations

import math

RULES = ("paper", "rownorm", "perhead", "oracle")
Q_TILE_ROWS = 128
KV_TILE = 64
CHUNK_TILES = 32            # query tiles per attention chunk (4096 rows)


def prefill(q, k, v, softmax_scale=None, block_size=128, alpha=0.1, sink_tokens=256,
            window_tokens=512, dense_recent_tiles=1, mean_correction=True, return_stats=False,
            rule="paper"):
    """q [L, Hq, D], k/v [L, Hkv, D] float32 torch tensors (one request, L_q = L_kv) -> out."""
    import torch

    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}: one of {RULES}")
    L, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    dev = q.device
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    bs = block_size
    nb = -(-L // bs)
    bstart = torch.arange(nb, device=dev) * bs
    bend = torch.clamp(bstart + bs, max=L)
    log_blen = torch.log((bend - bstart).float())
    rows = g * L
    nt = -(-rows // Q_TILE_ROWS)
    pad = nt * Q_TILE_ROWS - rows
    if rule == "perhead":
        if L % Q_TILE_ROWS:
            raise ValueError("perhead needs L to be a multiple of 128")
        tok = torch.arange(L, device=dev).repeat(g)                     # row r: head r // L
        head = torch.arange(g, device=dev).repeat_interleave(L)
        seq_tiles, tile_seq_index = nt // g, torch.arange(nt, device=dev) % (nt // g)
    else:
        tok = torch.arange(L, device=dev).repeat_interleave(g)          # PackGQA: head r % g
        head = torch.arange(g, device=dev).repeat(L)
        seq_tiles, tile_seq_index = nt, torch.arange(nt, device=dev)
    big = torch.full((pad,), L + 1, device=dev, dtype=tok.dtype)
    pmin = torch.cat([tok, big]).view(nt, Q_TILE_ROWS).amin(1)
    pmax = torch.cat([tok, -torch.ones_like(big)]).view(nt, Q_TILE_ROWS).amax(1)
    tile_of_row = torch.arange(rows, device=dev) // Q_TILE_ROWS
    cand = bstart[None, :] <= pmax[:, None]                              # [nt, nb]
    forced = (bstart[None, :] < sink_tokens) \
        | (bend[None, :] - 1 >= (pmin - window_tokens)[:, None]) \
        | (bend[None, :] - 1 >= pmin[:, None])
    recent = tile_seq_index >= seq_tiles - dense_recent_tiles
    valid = bstart[None, :] <= tok[:, None]                              # [rows, nb]
    causal_tiles = pmax // KV_TILE + 1
    key_block = torch.arange(L, device=dev) // bs
    keys = torch.arange(L, device=dev)
    # keys of block J that row r can see: clamp(min(end_J, p(r) + 1) - start_J, 0)
    visible = torch.clamp(torch.minimum(bend[None, :], tok[:, None] + 1) - bstart[None, :], min=0)

    out = torch.empty_like(q)
    sel_tiles = sel_pairs = 0
    for h in range(hkv):
        qh = q[:, h * g:(h + 1) * g, :]
        qp = (qh.permute(1, 0, 2) if rule == "perhead" else qh).reshape(rows, d)
        kh, vh = k[:, h, :], v[:, h, :]
        k_mean = _pool(kh, bs, nb)
        v_mean = _pool(vh, bs, nb)
        x = (qp @ k_mean.T) * scale                                      # [rows, nb]
        xm = torch.cat([x.masked_fill(~valid, float("-inf")),
                        torch.full((pad, nb), float("-inf"), device=dev)]).view(nt, Q_TILE_ROWS, nb)
        if rule in ("paper", "perhead"):
            m = xm.amax(dim=(1, 2), keepdim=True)
            energy = torch.exp(xm - m).sum(1)
        elif rule == "rownorm":
            energy = torch.nan_to_num(torch.softmax(xm, dim=-1), nan=0.0).sum(1)
        else:
            energy = _exact_block_mass(qp, kh, tok, scale, bs, nb, nt, pad)
        sel = cand & ((energy >= alpha * energy.amax(1, keepdim=True)) | forced)
        sel |= cand & recent[:, None]
        first_tile = bstart // KV_TILE
        last_tile = torch.minimum(-(-bend // KV_TILE), causal_tiles[:, None])   # [nt, nb]
        sel_tiles += int(((last_tile - first_tile).clamp(min=0) * sel).sum())
        sel_rows = sel[tile_of_row]                                      # [rows, nb]
        sel_pairs += int((visible * sel_rows).sum())
        fix = cand & ~sel & (bend[None, :] - 1 <= pmin[:, None]) if mean_correction else None

        oh = torch.empty((rows, d), device=dev, dtype=q.dtype)
        for r0 in range(0, rows, CHUNK_TILES * Q_TILE_ROWS):
            r1 = min(r0 + CHUNK_TILES * Q_TILE_ROWS, rows)
            s = (qp[r0:r1] @ kh.T) * scale
            keep = sel_rows[r0:r1][:, key_block] & (keys[None, :] <= tok[r0:r1, None])
            s = s.masked_fill(~keep, float("-inf"))
            values = vh
            if fix is not None:
                s_fix = (x[r0:r1] + log_blen[None, :]).masked_fill(~fix[tile_of_row[r0:r1]],
                                                                  float("-inf"))
                s = torch.cat([s, s_fix], dim=1)
                values = torch.cat([vh, v_mean], dim=0)
            oh[r0:r1] = torch.softmax(s, dim=-1) @ values
        out[tok, h * g + head] = oh
    if not return_stats:
        return out
    total_tiles = int(causal_tiles.sum()) * hkv
    total_pairs = hq * L * (L + 1) // 2
    return out, {"density": sel_tiles / total_tiles, "selected_tiles": sel_tiles,
                 "pair_density": sel_pairs / total_pairs}


def _pool(x, bs, nb):
    """[L, D] -> block means [nb, D] (float64 sums; the last block may be partial)."""
    import torch
    L, d = x.shape
    padded = torch.zeros((nb * bs, d), device=x.device, dtype=torch.float64)
    padded[:L] = x
    counts = torch.clamp(L - torch.arange(nb, device=x.device) * bs, max=bs).double()
    return (padded.view(nb, bs, d).sum(1) / counts[:, None]).float()


def _exact_block_mass(qp, kh, tok, scale, bs, nb, nt, pad):
    """[nt, nb]: per query tile, the sum over its rows of each block's exact softmax mass."""
    import torch
    rows, L = qp.shape[0], kh.shape[0]
    keys = torch.arange(L, device=qp.device)
    mass = torch.zeros((nt * Q_TILE_ROWS, nb), device=qp.device)
    for r0 in range(0, rows, CHUNK_TILES * Q_TILE_ROWS):
        r1 = min(r0 + CHUNK_TILES * Q_TILE_ROWS, rows)
        s = ((qp[r0:r1] @ kh.T) * scale).masked_fill(keys[None, :] > tok[r0:r1, None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        p = torch.nn.functional.pad(p, (0, nb * bs - L))
        mass[r0:r1] = p.view(r1 - r0, nb, bs).sum(-1)
    return mass.view(nt, Q_TILE_ROWS, nb).sum(1)
