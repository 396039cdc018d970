"""A numpy model of flashprefill's prefill, written from docs/ALGORITHM.md (float32 inputs).

It is *not* the library: the harness uses it only as `--backend reference`, to run the accuracy
study while the library is unavailable and to cross-check the library's selection and output on
real model activations (`--backend both`). It follows the contract stage by stage: PackGQA rows,
pooled means (Eq. 5), fused scoring and selection (Eq. 19-20, sink / window / diagonal / recent
rules), exact attention over the selected 64-token tiles and the log|B_J|-shifted surrogate keys of
the unselected fully visible blocks (Eq. 6).
"""

from __future__ import annotations

import math

import numpy as np

Q_TILE_ROWS = 128       # packed query rows per tile (kBlockM)
KV_TILE = 64            # physical KV tile (kBlockN); density is counted in these
LOG2E = 1.0 / math.log(2.0)


def prefill(q, k, v, softmax_scale=None, block_size=128, alpha=0.1, sink_tokens=256,
            window_tokens=512, dense_recent_tiles=1, mean_correction=True, return_stats=False):
    """q [L_q, Hq, D], k/v [L_kv, Hkv, D] float32, causal bottom-right -> out [L_q, Hq, D]
    (and stats {'density', 'selected_tiles', 'causal_tiles'} with return_stats)."""
    lq, hq, d = q.shape
    lkv, hkv, _ = k.shape
    if hq % hkv or block_size % KV_TILE or not 0.0 <= alpha <= 1.0 or lq > lkv:
        raise ValueError("bad prefill arguments")
    g = hq // hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    offset = lkv - lq
    bs = block_size
    n_blocks = -(-lkv // bs)
    block_start = np.arange(n_blocks) * bs
    block_end = np.minimum(block_start + bs, lkv)                   # end_J (exclusive)
    block_len = (block_end - block_start).astype(np.float32)

    rows = g * lq
    n_tiles = -(-rows // Q_TILE_ROWS)
    row_pos = offset + np.arange(rows) // g                          # p(r)
    tile_first = offset + (np.arange(n_tiles) * Q_TILE_ROWS) // g    # pmin(I)
    tile_last = offset + (np.minimum((np.arange(n_tiles) + 1) * Q_TILE_ROWS, rows) - 1) // g
    causal_tiles = tile_last // KV_TILE + 1                          # T_c(I)

    out = np.empty((lq, hq, d), dtype=np.float32)
    selected_tiles = 0
    for h in range(hkv):
        qp = q[:, h * g:(h + 1) * g, :].reshape(rows, d)            # PackGQA rows (Eq. 12-13)
        kh, vh = k[:, h, :], v[:, h, :]
        k_mean = _pool(kh, bs, n_blocks)                             # Eq. 5
        v_mean = _pool(vh, bs, n_blocks)
        x = (qp @ k_mean.T) * np.float32(scale * LOG2E)              # [rows, n_blocks]
        valid = block_start[None, :] <= row_pos[:, None]
        oh = np.empty((rows, d), dtype=np.float32)
        for tile in range(n_tiles):
            r0, r1 = tile * Q_TILE_ROWS, min((tile + 1) * Q_TILE_ROWS, rows)
            candidates = block_start <= tile_last[tile]
            xt, vt = x[r0:r1], valid[r0:r1]
            m = np.max(np.where(vt, xt, -np.inf))
            energy = np.where(vt, np.exp2(xt - m), 0.0).sum(axis=0)   # Eq. 19
            sel = candidates & (energy >= alpha * energy.max())        # Eq. 20, threshold
            sel |= candidates & (block_start < sink_tokens)                          # sink
            sel |= candidates & (block_end - 1 >= tile_first[tile] - window_tokens)  # window
            sel |= candidates & (block_end - 1 >= tile_first[tile])                  # diagonal
            if tile >= n_tiles - dense_recent_tiles:
                sel = candidates.copy()                                              # recent
            tiles_of_sel = np.minimum(np.ceil(block_end[sel] / KV_TILE), causal_tiles[tile]) \
                - block_start[sel] // KV_TILE
            selected_tiles += int(tiles_of_sel.sum())

            n_keys = int(tile_last[tile]) + 1
            key_block = np.arange(n_keys) // bs
            s = (qp[r0:r1] @ kh[:n_keys].T) * np.float32(scale)         # [rows, n_keys]
            keep = sel[key_block][None, :] & (np.arange(n_keys)[None, :] <= row_pos[r0:r1, None])
            s = np.where(keep, s, -np.inf)
            values = vh[:n_keys]
            if mean_correction:
                fix = candidates & ~sel & (block_end - 1 <= tile_first[tile])
                if fix.any():                                          # Eq. 6 surrogate keys
                    s_fix = (qp[r0:r1] @ k_mean[fix].T) * np.float32(scale) + np.log(block_len[fix])
                    s = np.concatenate([s, s_fix.astype(np.float32)], axis=1)
                    values = np.concatenate([values, v_mean[fix]], axis=0)
            s -= s.max(axis=1, keepdims=True)
            p = np.exp(s)
            oh[r0:r1] = (p @ values) / p.sum(axis=1, keepdims=True)
        out[:, h * g:(h + 1) * g, :] = oh.reshape(lq, g, d)

    if not return_stats:
        return out
    total = int(causal_tiles.sum()) * hkv
    return out, {"density": selected_tiles / total, "selected_tiles": selected_tiles,
                 "causal_tiles": total}


def _pool(x, bs, n_blocks):
    """[L, D] -> block means [n_blocks, D] (float64 sum, float32 result; last block may be partial)."""
    l, d = x.shape
    padded = np.zeros((n_blocks * bs, d), dtype=np.float64)
    padded[:l] = x
    counts = np.minimum(bs, l - np.arange(n_blocks) * bs).astype(np.float64)
    return (padded.reshape(n_blocks, bs, d).sum(axis=1) / counts[:, None]).astype(np.float32)
