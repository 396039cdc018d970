"""Torch variants of flashprefill's block selection, to measure what the selection *rule* costs.

Not the library, and nothing here changes it: `run.py --rules <rule>` runs the model with one of
these rules in every layer (float32, on the CPU or the GPU) so that rules can be compared at equal
density. Every rule keeps the library's structure of docs/ALGORITHM.md — 128-row query tiles, whole `block_size`
blocks, the forced sink / window / diagonal / recent blocks, the threshold `E_J >= alpha * max E`
and the Eq. 6 mean correction of unselected fully visible blocks — and differs only in the energy
`E_J` the threshold is applied to, or in the threshold:

| rule | tile rows | E_J |
| --- | --- | --- |
| `paper` | PackGQA (the g heads of a KV head, token-major), as the library | sum_r exp(x_rJ - M), M the tile's max (Eq. 19-20) |
| `rownorm` | PackGQA | sum_r softmax_J(x_rJ): every row's pooled distribution counts equally |
| `perhead` | 128 tokens of one query head (no GQA sharing) | as `paper` |
| `oracle` | PackGQA | sum_r of the row's exact softmax mass in block J (what the pooled score estimates) |

and two rules that keep the paper's energy but change the threshold (`select`):

| rule | kept besides the forced blocks |
| --- | --- |
| `freemax` | `E_J >= alpha * max E` with the max over the candidates no forced rule keeps (not the sink's or the diagonal's) |
| `topp` | all but the weakest free candidates whose energies sum to at most `alpha` of the tile's total (a sort and a prefix sum: no host synchronization) |

with x_rJ = q_r . k_mean_J * scale. Statistics: `density` counts 64-key tiles like the library
(selected / causal tiles of the tile grid); `pair_density` counts the causal (query row, key) pairs
computed, comparable across rules whose tile grids differ (`perhead`).

`prefill(..., rule="paper")` reproduces sparse_reference.prefill (the numpy model of the contract):
test_accuracy_units.py checks that on the CPU and, where there is one, on the GPU.
"""

from __future__ import annotations

import math

RULES = ("paper", "freemax", "topp", "rownorm", "perhead", "oracle")
Q_TILE_ROWS = 128
KV_TILE = 64
CHUNK_TILES = 32            # query tiles per attention chunk (4096 rows)


class Geometry:
    """The tile grid of one request (docs/ALGORITHM.md): PackGQA rows (or per-head rows for
    `perhead`), their query tiles and the blocks; which blocks each tile may see and which the
    forced rules keep. Tensors on q's device."""

    def __init__(self, L, g, bs, sink_tokens, window_tokens, dense_recent_tiles, device,
                 per_head=False):
        import torch
        nb = -(-L // bs)
        self.L, self.g, self.bs, self.nb = L, g, bs, nb
        self.bstart = torch.arange(nb, device=device) * bs
        self.bend = torch.clamp(self.bstart + bs, max=L)
        self.rows = rows = g * L
        self.nt = nt = -(-rows // Q_TILE_ROWS)
        self.pad = pad = nt * Q_TILE_ROWS - rows
        if per_head:
            if L % Q_TILE_ROWS:
                raise ValueError("perhead needs L to be a multiple of 128")
            self.tok = torch.arange(L, device=device).repeat(g)              # row r: head r // L
            self.head = torch.arange(g, device=device).repeat_interleave(L)
            seq_tiles, tile_seq_index = nt // g, torch.arange(nt, device=device) % (nt // g)
        else:
            self.tok = torch.arange(L, device=device).repeat_interleave(g)   # PackGQA: head r % g
            self.head = torch.arange(g, device=device).repeat(L)
            seq_tiles, tile_seq_index = nt, torch.arange(nt, device=device)
        tok = self.tok
        big = torch.full((pad,), L + 1, device=device, dtype=tok.dtype)
        self.pmin = torch.cat([tok, big]).view(nt, Q_TILE_ROWS).amin(1)
        self.pmax = torch.cat([tok, -torch.ones_like(big)]).view(nt, Q_TILE_ROWS).amax(1)
        self.tile_of_row = torch.arange(rows, device=device) // Q_TILE_ROWS
        bstart, bend = self.bstart[None, :], self.bend[None, :]
        self.cand = bstart <= self.pmax[:, None]                              # [nt, nb]
        self.sink = self.cand & (bstart < sink_tokens)
        self.diagonal = self.cand & (bend - 1 >= self.pmin[:, None])
        self.window = self.cand & (bend - 1 >= (self.pmin - window_tokens)[:, None])
        self.forced = self.sink | self.window | self.diagonal
        self.recent = tile_seq_index >= seq_tiles - dense_recent_tiles        # [nt]
        self.valid = self.bstart[None, :] <= tok[:, None]                     # [rows, nb]
        causal_tiles = self.pmax // KV_TILE + 1
        self.causal_tiles = int(causal_tiles.sum())
        # 64-key tiles of block J that tile I computes when it selects J
        last_tile = torch.minimum(-(-self.bend // KV_TILE), causal_tiles[:, None])
        self.block_tiles = (last_tile - self.bstart // KV_TILE).clamp(min=0)  # [nt, nb]

    def scores(self, qp, k_mean, scale):
        """x_rJ = q_r . k_mean_J * scale [rows, nb], and the same masked to visible blocks and
        padded to whole tiles [nt, 128, nb] (-inf elsewhere)."""
        import torch
        x = (qp @ k_mean.T) * scale
        xm = torch.cat([x.masked_fill(~self.valid, float("-inf")),
                        torch.full((self.pad, self.nb), float("-inf"), device=x.device)])
        return x, xm.view(self.nt, Q_TILE_ROWS, self.nb)


def energies(xm):
    """Eq. 19: E_IJ = sum_r exp(x_rJ - M_I), M_I the tile's max (xm from Geometry.scores)."""
    return (xm - xm.amax(dim=(1, 2), keepdim=True)).exp().sum(1)


def select(rule, geo, energy, alpha):
    """Selected blocks [nt, nb] under `rule` given each tile's block energies [nt, nb]."""
    import torch
    cand, forced = geo.cand, geo.forced
    if rule == "freemax":        # E_max over the candidates no forced rule keeps
        free = cand & ~forced
        top = energy.masked_fill(~free, float("-inf")).amax(1, keepdim=True)
        passed = free & (energy >= alpha * top)
    elif rule == "topp":         # drop the weakest free blocks holding <= alpha of the energy
        free = cand & ~forced
        total = energy.masked_fill(~cand, 0.0).sum(1, keepdim=True)
        e = energy.masked_fill(~free, float("inf"))
        order = e.argsort(1)
        sorted_e = e.gather(1, order)
        dropped_sorted = torch.cumsum(sorted_e.masked_fill(sorted_e.isinf(), 0.0), 1) \
            <= alpha * total
        dropped = torch.zeros_like(free).scatter(1, order, dropped_sorted)
        passed = free & ~dropped
    else:
        passed = cand & (energy >= alpha * energy.amax(1, keepdim=True))
    return cand & (passed | forced | geo.recent[:, None])


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
    geo = Geometry(L, g, bs, sink_tokens, window_tokens, dense_recent_tiles, dev,
                   per_head=rule == "perhead")
    nb, rows, nt, pad, tok = geo.nb, geo.rows, geo.nt, geo.pad, geo.tok
    log_blen = torch.log((geo.bend - geo.bstart).float())
    key_block = torch.arange(L, device=dev) // bs
    keys = torch.arange(L, device=dev)
    # keys of block J that row r can see: clamp(min(end_J, p(r) + 1) - start_J, 0)
    visible = torch.clamp(torch.minimum(geo.bend[None, :], tok[:, None] + 1) - geo.bstart[None, :],
                          min=0)

    out = torch.empty_like(q)
    sel_tiles = sel_pairs = 0
    for h in range(hkv):
        qh = q[:, h * g:(h + 1) * g, :]
        qp = (qh.permute(1, 0, 2) if rule == "perhead" else qh).reshape(rows, d)
        kh, vh = k[:, h, :], v[:, h, :]
        k_mean = _pool(kh, bs, nb)
        v_mean = _pool(vh, bs, nb)
        x, xm = geo.scores(qp, k_mean, scale)
        if rule == "rownorm":
            energy = torch.nan_to_num(torch.softmax(xm, dim=-1), nan=0.0).sum(1)
        elif rule == "oracle":
            energy = _exact_block_mass(qp, kh, tok, scale, bs, nb, nt, pad)
        else:
            energy = energies(xm)
        sel = select(rule, geo, energy, alpha)
        sel_tiles += int((geo.block_tiles * sel).sum())
        sel_rows = sel[geo.tile_of_row]                                  # [rows, nb]
        sel_pairs += int((visible * sel_rows).sum())
        fix = (geo.cand & ~sel & (geo.bend[None, :] - 1 <= geo.pmin[:, None])
               if mean_correction else None)

        oh = torch.empty((rows, d), device=dev, dtype=q.dtype)
        for r0 in range(0, rows, CHUNK_TILES * Q_TILE_ROWS):
            r1 = min(r0 + CHUNK_TILES * Q_TILE_ROWS, rows)
            s = (qp[r0:r1] @ kh.T) * scale
            keep = sel_rows[r0:r1][:, key_block] & (keys[None, :] <= tok[r0:r1, None])
            s = s.masked_fill(~keep, float("-inf"))
            values = vh
            if fix is not None:
                s_fix = (x[r0:r1] + log_blen[None, :]).masked_fill(
                    ~fix[geo.tile_of_row[r0:r1]], float("-inf"))
                s = torch.cat([s, s_fix], dim=1)
                values = torch.cat([vh, v_mean], dim=0)
            oh[r0:r1] = torch.softmax(s, dim=-1) @ values
        out[tok, h * g + geo.head] = oh
    if not return_stats:
        return out
    total_tiles = geo.causal_tiles * hkv
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
