"""Attention-operator benchmark: the flashprefill CUDA kernel against torch baselines.

B = 1, Hq = 32, Hkv = 8, D = 128, causal, bf16 unless stated. Our kernel is called through the
C ABI with plain ctypes (torch tensors' data_ptr() and the current stream); block-mask indexes
and their block means come from the package (flashprefill.Index.from_block_mask). Baselines run
in the same process on the same inputs: SDPA with the cuDNN backend (FA3-class) and the FLASH
backend (FA2), K/V expanded to 32 heads outside the timed region, and FlexAttention
(torch.compile) on the same block mask. Every time is common.median_ms: the median of
CUDA-event-timed calls queued back to back, after at least a second of the same calls so that the
SM clock has settled under this workload (clock_mhz: the clock NVML reports during the timed
calls). Sparse rows also give latency_ms: one call at a time on an idle GPU, the host's launch
work included. TFLOP/s counts causal FLOPs, 4 * Hq * D * (causal query-key pairs).

Rows:
  dense   L in --dense-lengths: our dense mode vs cuDNN / FLASH.
  sparse  fixed block density rho on a random 128x128 block mask (diagonal forced), each L in
          --sparse-lengths (32K, where an item at 5 % is ~8 stages, and 128K): ours with and
          without mean correction vs FlexAttention on the same mask, and the 1.15 * rho *
          dense-time goal; then one rho per --model-densities entry (a real model's measured
          density at its length, the row's `source`).
  prefill fp_build_index + fp_sparse_attention (default config) vs FLASH and cuDNN dense, at
          each L in --prefill-lengths (8K ... 128K), on two workloads: `demo`, the demo's
          structured workload (fp_demo_workload: sinks, local band, vertical columns, needles),
          and `demo_q_scaled`, the same with its queries scaled by one factor q_scale, chosen at
          --prefill-density-length so that the selection keeps --prefill-density (5 %) of the
          causal tiles there: the paper's needle-in-a-haystack regime at 128K.
  chunk   chunked prefill: one short chunk against a long cached prefix (--chunk-shapes:
          128 / 32K, 512 / 128K, 2048 / 64K), dense, with the heuristic's KV splits and with
          splitting forced off, vs bottom-right causal baselines: FlexAttention (document mask)
          and SDPA's memory-efficient backend (cuDNN and FLASH take none when L_q != L_kv).
  paged   L = --paged-length, dense: the same K/V in a paged cache (page sizes 1, 8, 16, 32, 64,
          100, 128, pages in shuffled order; 1, 16, 64 and 100 also in order; 1 and 16 also in runs
          of 1024 keys, the runs shuffled: page_permutation) against the contiguous
          layout in the same process, with the two outputs' largest difference and relative L2
          distance (not bit-identical: the cp.async path keeps a stage's two tiles in traversal
          order, the TMA path lower first). Then sparse mode on one random 10 % block mask, with
          and without correction, on pages of 16 keys (shuffled, in order) and 128 (shuffled),
          against the contiguous layout on the same mask (row=paged_sparse). Then chunked
          prefill (as in chunk) on pages of 16 and 1 keys (PAGED_CHUNK_ROWS) against the
          contiguous layout (row=paged_chunk).
  batch   B = 4 at 32K, dense vs cuDNN; a mixed batch with cached prefixes, dense, vs the same
          bottom-right baselines as chunk.

--results DIR writes the run's results file (common.ResultsFile: command, date, machine, commit,
rows; rewritten after every row), which bench/report.py renders into docs/PERF.md. --device cpu
runs the rows on the library's CPU reference without the CUDA baselines: a smoke run of the code
paths at small lengths, not a measurement.

Usage: python3 bench/bench_attention.py [--lib build/libflashprefill.so] [--results bench/results]
       [--json rows.json] [--skip chunk,paged,batch] [--device cpu] [--dense-lengths ...]
"""

import argparse
import ctypes
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import common
from common import latency_ms, median_ms, Problem, SelectConfig, Index, IndexSizes, Output

FP_CPU, FP_CUDA, FP_BF16, FP_CONTIGUOUS, FP_PAGED = 0, 1, 1, 0, 1
HQ, HKV, D = 32, 8, 128
G = HQ // HKV
DEMO_SEED = 20260823  # the demo's default seed (src/core/workload.hpp)
# --model-densities: SmolLM2-135M's measured density at 8K, alpha 0.1, mean correction on
# (accuracy/results/gpu/tables.md, docs/ACCURACY.md): a sparse row at a real model's density
# beside the fixed-density ones.
MODEL_DENSITIES = "8192:0.222:SmolLM2-135M at 8K (alpha 0.1)"
DEV = "cuda"  # --device: "cpu" runs every row on the library's CPU reference (a smoke run)


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.fp_last_error_message.restype = ctypes.c_char_p
        self.lib.fp_select_config_default.restype = None

    def check(self, status):
        if status != 0:
            raise RuntimeError(self.lib.fp_last_error_message().decode())

    def size(self, fn, *args):
        n = ctypes.c_size_t()
        self.check(fn(*args, ctypes.byref(n)))
        return n.value

    def config(self, alpha=0.1, correction=1):
        c = SelectConfig()
        self.lib.fp_select_config_default(ctypes.byref(c))
        c.alpha, c.mean_correction = alpha, correction
        return c


class Batch:
    """A contiguous varlen batch: q [total_q, HQ, D], k/v [total_k, HKV, D], bf16 on the GPU."""

    def __init__(self, len_q, len_kv, q=None, k=None, v=None):
        dev = DEV
        self.len_q, self.len_kv = list(len_q), list(len_kv)
        self.q = q if q is not None else torch.randn(sum(len_q), HQ, D, device=dev, dtype=torch.bfloat16)
        self.k = k if k is not None else torch.randn(sum(len_kv), HKV, D, device=dev, dtype=torch.bfloat16)
        self.v = v if v is not None else torch.randn(sum(len_kv), HKV, D, device=dev, dtype=torch.bfloat16)
        to_cu = lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0).tolist()),
                                        dtype=torch.int32, device=dev)
        self.cu_q, self.cu_k = to_cu(len_q), to_cu(len_kv)
        self.out = torch.empty_like(self.q)
        p = Problem()
        p.device, p.dtype, p.batch_size = (FP_CUDA if DEV == "cuda" else FP_CPU), FP_BF16, len(len_q)
        p.num_heads_q, p.num_heads_kv, p.head_dim = HQ, HKV, D
        p.q, p.q_stride_token, p.q_stride_head = self.q.data_ptr(), HQ * D, D
        p.total_q, p.cu_seqlens_q, p.max_seqlen_q = self.q.shape[0], self.cu_q.data_ptr(), max(len_q)
        p.kv_layout, p.k, p.v = FP_CONTIGUOUS, self.k.data_ptr(), self.v.data_ptr()
        p.k_stride_token = p.v_stride_token = HKV * D
        p.k_stride_head = p.v_stride_head = D
        p.max_seqlen_k, p.total_k, p.cu_seqlens_k = max(len_kv), self.k.shape[0], self.cu_k.data_ptr()
        self.problem = p
        o = Output()
        o.out, o.out_stride_token, o.out_stride_head = self.out.data_ptr(), HQ * D, D
        self.output = o

    def causal_pairs(self):
        return sum(lq * lk - lq * (lq - 1) // 2 for lq, lk in zip(self.len_q, self.len_kv))

    def poisoned_run(self, fn):
        """Runs fn once into a NaN-poisoned output and returns a copy of what it wrote."""
        self.out.fill_(float("nan"))
        fn()
        return self.out.clone()

    def bind_stream(self):
        if DEV == "cuda":
            self.problem.stream = torch.cuda.current_stream().cuda_stream


PAGE_ORDERS = ("shuffled", "in_order", "runs")
RUN_KEYS = 1024  # order "runs": keys per run of consecutive pages


def page_permutation(n, page_size, order, gen):
    """Physical page of each of a request's n logical pages. "shuffled": a random permutation;
    "in_order": page j at physical page j; "runs": the request's pages in runs of RUN_KEYS keys
    (the first run shorter by a random offset, so that run boundaries fall inside pairs of tiles),
    each run's pages consecutive in the pool, the runs in shuffled order: a pool fragmented the
    way an allocator that hands out free ranges leaves it."""
    if order == "shuffled":
        return torch.randperm(n, generator=gen, device=DEV)
    if order == "in_order":
        return torch.arange(n, device=DEV)
    assert order == "runs", order
    per_run = max(1, RUN_KEYS // page_size)
    first = int(torch.randint(1, per_run + 1, (1,), generator=gen, device=DEV))
    bounds = [0] + list(range(first, n, per_run)) + [n]
    runs = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    placement = torch.randperm(len(runs), generator=gen, device=DEV).tolist()
    perm = torch.empty(n, dtype=torch.int64)
    start = 0
    for i in placement:  # runs laid out in the pool in shuffled order
        a, b = runs[i]
        perm[a:b] = torch.arange(start, start + b - a)
        start += b - a
    return perm.to(DEV)


class PagedView:
    """A one-request Batch's K/V copied into a paged cache of page_size rows, its pages placed in
    `order` (page_permutation), with the page table and the problem that reads it; q and the
    output are the batch's."""

    def __init__(self, batch, page_size, gen, order="shuffled"):
        assert len(batch.len_kv) == 1, "one request"
        L = batch.len_kv[0]
        n = math.ceil(L / page_size)
        perm = page_permutation(n, page_size, order, gen)
        self.page_table = perm.to(torch.int32).contiguous()
        self.seqlens_k = torch.tensor([L], dtype=torch.int32, device=DEV)
        pools = []
        for src in (batch.k, batch.v):
            pool = torch.zeros(n * page_size, HKV, D, device=DEV, dtype=src.dtype)
            pool[:L] = src
            pool = pool.view(n, page_size, HKV, D)
            placed = torch.empty_like(pool)
            placed[perm] = pool  # logical page j lives in physical page perm[j]
            pools.append(placed)
        self.k, self.v = pools
        p = Problem.from_buffer_copy(batch.problem)
        p.kv_layout, p.k, p.v = FP_PAGED, self.k.data_ptr(), self.v.data_ptr()
        p.k_stride_page = p.v_stride_page = page_size * HKV * D
        p.num_pages, p.page_size = n, page_size
        p.page_table, p.max_pages_per_seq = self.page_table.data_ptr(), n
        p.seqlens_k = self.seqlens_k.data_ptr()
        p.total_k, p.cu_seqlens_k = 0, None
        self.problem = p


def tflops(batch, ms):
    if ms is None:
        return None
    return 4.0 * HQ * D * batch.causal_pairs() / (ms * 1e-3) / 1e12


class Ours:
    def __init__(self, lib, batch):
        self.lib, self.b = lib, batch
        batch.bind_stream()
        self.ws_dense = self._alloc(lib.size(lib.lib.fp_dense_attention_workspace_size,
                                             ctypes.byref(batch.problem)))

    @staticmethod
    def _alloc(n):
        return torch.empty(max(n, 1), dtype=torch.uint8, device=DEV)

    def dense(self):
        self.lib.check(self.lib.lib.fp_dense_attention(
            ctypes.byref(self.b.problem), ctypes.byref(self.b.output),
            ctypes.c_void_p(self.ws_dense.data_ptr()), ctypes.c_size_t(self.ws_dense.numel())))

    def dense_paged(self, view):
        """Dense mode on a PagedView of the batch, into the batch's output."""
        ws = self._alloc(self.lib.size(self.lib.lib.fp_dense_attention_workspace_size,
                                       ctypes.byref(view.problem)))

        def run():
            self.lib.check(self.lib.lib.fp_dense_attention(
                ctypes.byref(view.problem), ctypes.byref(self.b.output),
                ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws.numel())))
        return run

    def sparse_paged(self, view):
        """Sparse mode (the index of the last use_block_mask) on a PagedView of the batch."""
        ws = self._alloc(self.lib.size(self.lib.lib.fp_sparse_attention_workspace_size,
                                       ctypes.byref(view.problem), ctypes.byref(self.config)))

        def run():
            self.lib.check(self.lib.lib.fp_sparse_attention(
                ctypes.byref(view.problem), ctypes.byref(self.config), ctypes.byref(self.index),
                ctypes.byref(self.b.output), ctypes.c_void_p(ws.data_ptr()),
                ctypes.c_size_t(ws.numel())))
        return run

    def sizes(self, config):
        s = IndexSizes()
        self.lib.check(self.lib.lib.fp_index_sizes_query(ctypes.byref(self.b.problem),
                                                         ctypes.byref(config), ctypes.byref(s)))
        return s

    def prepare_sparse(self, config, cu, idx, k_mean, v_mean):
        self.config = config
        self.keep = (cu, idx, k_mean, v_mean)
        self.index = Index(cu.data_ptr(), idx.data_ptr(), k_mean.data_ptr(),
                           None if v_mean is None else v_mean.data_ptr(), idx.numel())
        self.ws_sparse = self._alloc(self.lib.size(self.lib.lib.fp_sparse_attention_workspace_size,
                                                   ctypes.byref(self.b.problem), ctypes.byref(config)))

    def use_block_mask(self, mask, correction):
        """Sparse mode on a 128x128 block mask [HKV, n, n] of the batch's single request, its
        index and block means made by the package (flashprefill.Index.from_block_mask), at
        alpha 0.1; returns the index's density over the causal tiles."""
        cfg = self.lib.config(alpha=0.1, correction=correction)
        index = common.fp.Index.from_block_mask(
            mask, self.b.q, self.b.k, self.b.v,
            common.fp.SelectConfig(alpha=0.1, mean_correction=bool(correction)))
        self.prepare_sparse(cfg, index.cu, index.idx, index.k_mean, index.v_mean)
        return index.density()

    def sparse(self):
        self.lib.check(self.lib.lib.fp_sparse_attention(
            ctypes.byref(self.b.problem), ctypes.byref(self.config), ctypes.byref(self.index),
            ctypes.byref(self.b.output), ctypes.c_void_p(self.ws_sparse.data_ptr()),
            ctypes.c_size_t(self.ws_sparse.numel())))

    def build_index(self, config):
        s = self.sizes(config)
        cu = torch.zeros(s.num_segments + 1, dtype=torch.int32, device=DEV)
        idx = torch.zeros(max(s.idx_capacity, 1), dtype=torch.int32, device=DEV)
        km = torch.zeros(max(s.mean_elements, 1), dtype=torch.float32, device=DEV)
        vm = torch.zeros_like(km)
        self.prepare_sparse(config, cu, idx, km, vm)
        ws = self._alloc(self.lib.size(self.lib.lib.fp_build_index_workspace_size,
                                       ctypes.byref(self.b.problem), ctypes.byref(config)))

        def run():
            self.lib.check(self.lib.lib.fp_build_index(
                ctypes.byref(self.b.problem), ctypes.byref(config), ctypes.byref(self.index),
                ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws.numel())))
        return run

    def density(self):
        d = ctypes.c_double()
        self.lib.check(self.lib.lib.fp_index_density(ctypes.byref(self.b.problem), ctypes.byref(self.config),
                                                     ctypes.byref(self.index), ctypes.byref(d)))
        return d.value


def random_block_mask(L, rho, gen):
    n = math.ceil(L / 128)
    m = torch.rand(HKV, n, n, device=DEV, generator=gen) < rho
    m |= torch.eye(n, dtype=torch.bool, device=DEV)[None]
    return m & torch.tril(torch.ones(n, n, dtype=torch.bool, device=DEV))[None]


def sdpa(batch, backend, requests=1):
    """Causal SDPA on the batch's q/k/v as `requests` equal-length sequences, K/V expanded to Hq."""
    q = batch.q.view(requests, -1, HQ, D).transpose(1, 2)
    k = batch.k.view(requests, -1, HKV, D).transpose(1, 2).repeat_interleave(G, 1)
    v = batch.v.view(requests, -1, HKV, D).transpose(1, 2).repeat_interleave(G, 1)

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


def lower_right_baselines(batch):
    """Bottom-right causal attention (query i of a request sees keys j <= L_kv - L_q + i) over a
    varlen batch with torch, for the mixed batch with cached prefixes: FlexAttention in one call
    on the packed sequences (a document mask), and SDPA's memory-efficient backend one request at
    a time (causal_lower_right). SDPA's cuDNN and FLASH backends take no bottom-right causal mask
    when L_q != L_kv. Returns {name: (run, output [total_q, HQ, D] of the last run)}."""
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    dev = DEV
    lq = torch.tensor(batch.len_q, device=dev)
    lk = torch.tensor(batch.len_kv, device=dev)
    q_doc = torch.repeat_interleave(torch.arange(len(batch.len_q), device=dev), lq)
    kv_doc = torch.repeat_interleave(torch.arange(len(batch.len_kv), device=dev), lk)
    q_pos = (torch.arange(q_doc.numel(), device=dev) - batch.cu_q[:-1].long()[q_doc]
             + (lk - lq)[q_doc])
    kv_pos = torch.arange(kv_doc.numel(), device=dev) - batch.cu_k[:-1].long()[kv_doc]

    def mask_mod(b, h, qi, ki):
        return (q_doc[qi] == kv_doc[ki]) & (kv_pos[ki] <= q_pos[qi])
    bm = torch.compile(create_block_mask)(mask_mod, None, None, q_doc.numel(), kv_doc.numel(),
                                          device=dev)
    flex = torch.compile(flex_attention, dynamic=False)
    q = batch.q.view(1, -1, HQ, D).transpose(1, 2)
    k = batch.k.view(1, -1, HKV, D).transpose(1, 2)
    v = batch.v.view(1, -1, HKV, D).transpose(1, 2)
    flex_out = {}

    def run_flex():
        flex_out["o"] = flex(q, k, v, block_mask=bm, enable_gqa=True)

    requests = []
    for r, (a, e) in enumerate(zip(batch.cu_q.tolist()[:-1], batch.cu_q.tolist()[1:])):
        ka, ke = batch.cu_k[r].item(), batch.cu_k[r + 1].item()
        requests.append((batch.q[a:e].unsqueeze(0).transpose(1, 2),
                         batch.k[ka:ke].unsqueeze(0).transpose(1, 2).repeat_interleave(G, 1),
                         batch.v[ka:ke].unsqueeze(0).transpose(1, 2).repeat_interleave(G, 1),
                         causal_lower_right(e - a, ke - ka)))
    eff_out = {}

    def run_efficient():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            eff_out["o"] = [F.scaled_dot_product_attention(qr, kr, vr, attn_mask=m)
                            for qr, kr, vr, m in requests]

    return {"flex": (run_flex, lambda: flex_out["o"][0].transpose(0, 1)),
            "efficient": (run_efficient,
                          lambda: torch.cat([o[0].transpose(0, 1) for o in eff_out["o"]]))}


def add_lower_right_baselines(row, batch, ours_out, ours_ms):
    """Times lower_right_baselines(batch) into `row`: each baseline's time, our speedup over it
    and our output's relative error against its output (a failure is reported, the row kept).
    Not on the CPU, where these baselines are compiled for or run on the GPU only."""
    if DEV != "cuda":
        return
    try:
        for name, (run, output) in lower_right_baselines(batch).items():
            run()
            row[f"{name}_relerr"] = rel_err(ours_out, output())
            t_base = median_ms(run)
            row[f"{name}_ms"] = t_base
            row[f"ours_vs_{name}"] = t_base / ours_ms
    except Exception as e:  # noqa: BLE001 - report, keep the row
        print("bottom-right baselines unavailable:", str(e).splitlines()[0][:160])


class Flex:
    """FlexAttention on the same 128x128 block mask. The BlockMask is built from the block mask
    itself (BlockMask.from_kv_blocks): the selected blocks below the diagonal are full blocks, the
    diagonal block (always selected) the one partial block, with the causal mask_mod.
    create_block_mask would evaluate the mask_mod at every (query, key) pair instead, 2^34 per
    head at 128K."""

    def __init__(self, batch):
        from torch.nn.attention.flex_attention import BlockMask, flex_attention
        self.from_kv_blocks = BlockMask.from_kv_blocks
        self.L = batch.len_q[0]
        self.q = batch.q.view(1, -1, HQ, D).transpose(1, 2)
        self.k = batch.k.view(1, -1, HKV, D).transpose(1, 2)
        self.v = batch.v.view(1, -1, HKV, D).transpose(1, 2)
        self.fn = torch.compile(flex_attention, dynamic=False)

    @staticmethod
    def causal(b, h, qi, ki):
        return qi >= ki

    def bind(self, mask):
        """mask [HKV, n, n] (random_block_mask: diagonal set, nothing above it)."""
        n = mask.shape[-1]
        eye = torch.eye(n, dtype=torch.bool, device=mask.device)
        full = (mask & ~eye).repeat_interleave(G, dim=0)[None]          # [1, HQ, n, n]
        # Each row's full blocks first, in increasing order (a stable sort of "not selected").
        full_idx = torch.argsort((~full).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        full_num = full.sum(-1, dtype=torch.int32)
        # Index tensors span every KV block (from_kv_blocks reads their last size as the block
        # count); entries past a row's count are ignored.
        diag_num = torch.ones(1, HQ, n, dtype=torch.int32, device=mask.device)
        diag_idx = torch.zeros(n, n, dtype=torch.int32, device=mask.device)
        diag_idx[:, 0] = torch.arange(n, dtype=torch.int32, device=mask.device)
        diag_idx = diag_idx.expand(1, HQ, n, n).contiguous()
        bm = self.from_kv_blocks(diag_num, diag_idx, full_num, full_idx, BLOCK_SIZE=128,
                                 mask_mod=Flex.causal, seq_lengths=(self.L, self.L))
        return lambda: self.fn(self.q, self.k, self.v, block_mask=bm, enable_gqa=True)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def structured_workload(lib, L):
    """The demo's workload (fp_demo_workload: sinks, local band, vertical columns, needles), the
    same inputs `flashprefill demo` runs on."""
    q = torch.empty(L, HQ, D, dtype=torch.float32)
    k = torch.empty(L, HKV, D, dtype=torch.float32)
    v = torch.empty(L, HKV, D, dtype=torch.float32)
    lib.check(lib.lib.fp_demo_workload(ctypes.c_int32(L), ctypes.c_int32(HQ), ctypes.c_int32(HKV),
                                       ctypes.c_int32(D), ctypes.c_uint64(DEMO_SEED),
                                       ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()),
                                       ctypes.c_void_p(v.data_ptr())))
    return (t.to(DEV, torch.bfloat16) for t in (q, k, v))


def main():
    global DEV
    started = common.utc_now()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libflashprefill.so")
    ap.add_argument("--json", default=None, help="also write the rows alone to this file")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="write the run's results file (command, date, machine, commit, rows) "
                         "into DIR, e.g. bench/results")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: every row on the library's CPU reference, SDPA's CUDA backends "
                         "and FlexAttention left out (a smoke run of the code paths)")
    ap.add_argument("--dense-lengths", default="8192,32768,131072")
    ap.add_argument("--sparse-lengths", default="32768,131072")
    ap.add_argument("--prefill-lengths", default="8192,16384,32768,65536,131072")
    ap.add_argument("--prefill-density", type=float, default=0.05,
                    help="density the scaled-query prefill workload keeps at "
                         "--prefill-density-length (0: leave that workload out)")
    ap.add_argument("--prefill-density-length", type=int, default=131072,
                    help="length at which the query scale is chosen (the longest prefill length "
                         "when this one is not among them)")
    ap.add_argument("--model-densities", default=MODEL_DENSITIES,
                    help="comma list of L:rho:source, sparse rows at a density a real model "
                         "measured ('' for none)")
    ap.add_argument("--paged-length", type=int, default=32768)
    ap.add_argument("--chunk-shapes", default="128:32768,512:131072,2048:65536",
                    help="comma list of L_q:L_kv, the chunk and paged_chunk rows")
    ap.add_argument("--skip", default="", help="comma list of row groups to skip")
    args = ap.parse_args()
    DEV = common.DEVICE = args.device
    skip = set(args.skip.split(",")) if args.skip else set()
    common.load_package(args.lib)
    lib = Lib(args.lib)
    torch.manual_seed(0)
    gen = torch.Generator(device=DEV)
    gen.manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    rows = []
    results = common.ResultsFile(args.results, "attention", started) if args.results else None
    print(f"# {common.machine()}  torch {torch.__version__}", flush=True)

    report = common.reporter(rows, results)

    dense_ms = {}
    groups = [g for g in ("dense", "sparse", "prefill", "chunk", "paged", "batch") if g not in skip]
    for group in groups:
        try:
            run_group(group, args, lib, gen, report, dense_ms)
        except Exception as e:  # noqa: BLE001 - one failing group must not hide the others
            print(f"row={group}  failed={type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
        empty_cache()

    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if results:
        print("results:", results.write(rows, complete=True))
    return 0


# The paged group's dense rows: (page size, page order).
PAGED_ROWS = [(ps, "shuffled") for ps in (1, 8, 16, 32, 64, 100, 128)] + \
             [(ps, "in_order") for ps in (1, 16, 64, 100)] + [(ps, "runs") for ps in (1, 16)]
# Its chunked-prefill rows.
PAGED_CHUNK_ROWS = [(16, "shuffled"), (16, "runs"), (16, "in_order"), (1, "shuffled"), (1, "runs")]


def paged_fields(b, make_run, page_size, order, gen, contiguous_out, t_contiguous):
    """Times make_run(view) on a PagedView of batch b in `order` against the contiguous layout
    (its output and time): the row's paged fields, in the order the paged rows print them."""
    view = PagedView(b, page_size, gen, order)
    run = make_run(view)
    out = b.poisoned_run(run)
    t = median_ms(run)
    return dict(page_size=page_size, pages=order, ours_ms=t, contiguous_ms=t_contiguous,
                paged_vs_contiguous=t / t_contiguous,
                maxdiff_vs_contiguous=(out.float() - contiguous_out.float()).abs().max().item(),
                relerr_vs_contiguous=rel_err(out, contiguous_out),
                finite=bool(torch.isfinite(out).all()), clock_mhz=common.last_clock_mhz)


def sparse_rows(L, lib, gen, report, dense_ms, rhos=(0.5, 0.2, 0.1, 0.05), source=None):
    """The sparse group at one length: random block masks at every rho, with and without
    correction, against FlexAttention on the same mask. `source` names where a density came
    from (a real model's measured density), kept in the rows."""
    b = Batch([L], [L])
    ours = Ours(lib, b)
    t_dense = dense_ms.get(L) or median_ms(ours.dense)
    flex = None
    try:
        if DEV == "cuda":  # FlexAttention is compiled for the GPU only here
            flex = Flex(b)
    except Exception as e:  # noqa: BLE001 - report, keep benchmarking
        print("flex unavailable:", str(e).splitlines()[0][:120])
    for rho in rhos:
        mask = random_block_mask(L, rho, gen)
        for corr in (0, 1):
            density = ours.use_block_mask(mask, corr)
            finite = bool(torch.isfinite(b.poisoned_run(ours.sparse)).all())
            t = median_ms(ours.sparse)
            clock = common.last_clock_mhz
            t_latency = latency_ms(ours.sparse)
            row = dict(row="sparse", L=L, rho=rho, density=density, correction=corr, ours_ms=t,
                       dense_ms=t_dense, ratio_to_rho_dense=t / (density * t_dense), finite=finite,
                       clock_mhz=clock, latency_ms=t_latency)
            if source:
                row["source"] = source
            if corr == 0 and flex is not None:
                ref_out = b.out.clone()
                try:
                    fx = flex.bind(mask)
                    err = rel_err(ref_out, fx().transpose(1, 2).reshape(L, HQ, D))
                    t_flex = median_ms(fx)
                    row.update(flex_ms=t_flex, speedup_vs_flex=t_flex / t, err_vs_flex=err)
                except Exception as e:  # noqa: BLE001 - report, keep benchmarking
                    row.update(flex="failed: " + str(e).splitlines()[0][:80])
            report(row)
    del b, ours
    empty_cache()


def scaled_density(ours, b, q, scale, cfg):
    """The index's density on the batch with its queries scaled by `scale` (the index built
    by the library with cfg), leaving the batch on the scaled queries."""
    b.q.copy_(q * scale)
    ours.build_index(cfg)()
    sync()
    return ours.density()


def calibrate_q_scale(ours, b, q, cfg, target, steps=14):
    """The query scale s in (0, 1] at which the library's own selection keeps `target` of the
    causal tiles of this workload: smaller s flattens every block's scores (s -> 0 selects every
    block), so density falls as s grows; bisection on log2 s in [-12, 0]."""
    if scaled_density(ours, b, q, 1.0, cfg) >= target:
        return 1.0
    lo, hi = -12.0, 0.0  # density(2^lo) >= target > density(2^hi)
    for _ in range(steps):
        mid = (lo + hi) / 2
        if scaled_density(ours, b, q, 2.0 ** mid, cfg) >= target:
            lo = mid
        else:
            hi = mid
    return 2.0 ** lo


def prefill_rows(args, lib, report):
    """The whole prefill (fp_build_index + fp_sparse_attention, default config) on the demo's
    workload at every --prefill-lengths, and on the same workload with its queries scaled so that
    the selection keeps --prefill-density of the causal tiles at --prefill-density-length (the
    scale found there is used at every length). Dense SDPA (FLASH = FA2, cuDNN) on the same
    shapes is timed once per length for both."""
    lengths = sorted({int(x) for x in args.prefill_lengths.split(",")}, reverse=True)
    calibrate_at = args.prefill_density_length
    if calibrate_at not in lengths:
        calibrate_at = lengths[0]
    q_scale = None
    for L in [calibrate_at] + [x for x in lengths if x != calibrate_at]:
        q, k, v = structured_workload(lib, L)
        b = Batch([L], [L], q.clone(), k, v)
        ours = Ours(lib, b)
        cfg = lib.config()
        if q_scale is None and args.prefill_density > 0:
            q_scale = calibrate_q_scale(ours, b, q, cfg, args.prefill_density)
            print(f"prefill: query scale {q_scale:.4g} keeps {args.prefill_density:g} of the "
                  f"causal tiles at L = {L}", flush=True)
        baselines = {}
        cases = [("demo", 1.0)] + ([("demo_q_scaled", q_scale)] if q_scale is not None else [])
        for workload, scale in cases:
            b.q.copy_(q * scale)
            build = ours.build_index(cfg)
            build()
            sync()
            density = ours.density()
            t_index = median_ms(build)
            t_attn = median_ms(ours.sparse)
            if not baselines:
                baselines = {name: try_ms(sdpa(b, backend)) for name, backend in
                             (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("fa2", SDPBackend.FLASH_ATTENTION))}
            ours.sparse()
            err = reference_error(b, b.out.clone())
            total = t_index + t_attn
            row = dict(row="prefill", workload=workload, L=L, q_scale=scale, density=density,
                       index_ms=t_index, attn_ms=t_attn, total_ms=total,
                       fa2_ms=baselines["fa2"], cudnn_ms=baselines["cudnn"])
            for name in ("fa2", "cudnn"):
                if baselines[name] is not None:
                    row[f"speedup_vs_{name}"] = baselines[name] / total
            row["err_vs_dense"] = err
            if workload == "demo_q_scaled":
                row.update(target_density=args.prefill_density, calibrated_at=calibrate_at)
            report(row)
        del b, ours, q, k, v
        empty_cache()


def reference_error(b, out):
    """Relative L2 distance of `out` to exact attention on the batch (cuDNN on the GPU, SDPA's
    math backend on the CPU), or None where no reference runs."""
    backend = SDPBackend.CUDNN_ATTENTION if DEV == "cuda" else SDPBackend.MATH
    try:
        L = b.len_q[0]
        ref = sdpa(b, backend)().transpose(1, 2).reshape(L, HQ, D)
    except RuntimeError as e:
        print("reference unavailable:", str(e).splitlines()[0][:120], flush=True)
        return None
    return rel_err(out, ref)


def try_ms(fn):
    """median_ms(fn), or None when the baseline cannot run here (reported, the row kept)."""
    try:
        return median_ms(fn)
    except RuntimeError as e:
        print("baseline unavailable:", str(e).splitlines()[0][:120], flush=True)
        return None


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


def chunk_shapes(args):
    """[(L_q, L_kv)] of --chunk-shapes."""
    return [tuple(int(x) for x in spec.split(":")) for spec in args.chunk_shapes.split(",")]


def run_group(group, args, lib, gen, report, dense_ms):
    if group == "paged":
        L = args.paged_length
        b = Batch([L], [L])
        ours = Ours(lib, b)
        contiguous_out = b.poisoned_run(ours.dense)
        t_contiguous = median_ms(ours.dense)
        clock_contiguous = common.last_clock_mhz
        for page_size, order in PAGED_ROWS:
            row = paged_fields(b, ours.dense_paged, page_size, order, gen, contiguous_out,
                               t_contiguous)
            report(dict(row="paged", L=L, **row, ours_tflops=tflops(b, row["ours_ms"]),
                        contiguous_clock_mhz=clock_contiguous))
        # Sparse mode on paged caches: one random 10 % block mask, with and without correction,
        # against the contiguous layout on the same mask.
        mask = random_block_mask(L, 0.1, gen)
        for corr in (0, 1):
            density = ours.use_block_mask(mask, corr)
            contiguous_out = b.poisoned_run(ours.sparse)
            t_contiguous = median_ms(ours.sparse)
            for page_size, order in ((16, "shuffled"), (16, "in_order"), (128, "shuffled")):
                report(dict(row="paged_sparse", L=L, density=density, correction=corr,
                            **paged_fields(b, ours.sparse_paged, page_size, order, gen,
                                           contiguous_out, t_contiguous)))
        del b, ours
        empty_cache()
        # Chunked prefill on paged caches (the serving case: a new chunk against its cached
        # prefix, KV splits by the heuristic), against the contiguous layout.
        for lq, lkv in chunk_shapes(args):
            b = Batch([lq], [lkv])
            ours = Ours(lib, b)
            contiguous_out = b.poisoned_run(ours.dense)
            t_contiguous = median_ms(ours.dense)
            for page_size, order in PAGED_CHUNK_ROWS:
                report(dict(row="paged_chunk", len_q=lq, len_kv=lkv,
                            **paged_fields(b, ours.dense_paged, page_size, order, gen,
                                           contiguous_out, t_contiguous)))
            del b, ours
            empty_cache()
    if group == "dense":
        for L in [int(x) for x in args.dense_lengths.split(",")]:
            b = Batch([L], [L])
            ours = Ours(lib, b)
            err = reference_error(b, b.poisoned_run(ours.dense))
            t_ours = median_ms(ours.dense)
            clock = common.last_clock_mhz
            t_cudnn = try_ms(sdpa(b, SDPBackend.CUDNN_ATTENTION))
            clock_cudnn = common.last_clock_mhz
            t_fa2 = try_ms(sdpa(b, SDPBackend.FLASH_ATTENTION))
            dense_ms[L] = t_ours
            report(dict(row="dense", L=L, ours_ms=t_ours, ours_tflops=tflops(b, t_ours),
                        cudnn_ms=t_cudnn, cudnn_tflops=tflops(b, t_cudnn), fa2_ms=t_fa2,
                        fa2_tflops=tflops(b, t_fa2),
                        ours_vs_cudnn=None if t_cudnn is None else t_cudnn / t_ours,
                        err_vs_cudnn=err, clock_mhz=clock, cudnn_clock_mhz=clock_cudnn))
            del b, ours
            empty_cache()

    if group == "sparse":
        for L in [int(x) for x in args.sparse_lengths.split(",")]:
            sparse_rows(L, lib, gen, report, dense_ms)
        for spec in filter(None, args.model_densities.split(",")):
            L, rho, source = spec.split(":", 2)
            sparse_rows(int(L), lib, gen, report, dense_ms, rhos=(float(rho),), source=source)

    if group == "prefill":
        prefill_rows(args, lib, report)

    if group == "batch":
        b = Batch([32768] * 4, [32768] * 4)
        ours = Ours(lib, b)
        t = median_ms(ours.dense)
        t_cudnn = median_ms(sdpa(b, SDPBackend.CUDNN_ATTENTION, requests=4))
        report(dict(row="batch4", L=32768, ours_ms=t, ours_tflops=tflops(b, t), cudnn_ms=t_cudnn,
                    cudnn_tflops=tflops(b, t_cudnn)))
        del b, ours
        empty_cache()
        # Mixed batch with cached prefixes (chunked prefill of several requests).
        len_q, len_kv = [2048, 512, 8192, 1024], [32768, 16384, 8192, 65536]
        b = Batch(len_q, len_kv)
        ours = Ours(lib, b)
        t = median_ms(ours.dense)
        row = dict(row="mixed_dense", len_q=str(len_q), len_kv=str(len_kv), ours_ms=t,
                   ours_tflops=tflops(b, t))
        add_lower_right_baselines(row, b, b.poisoned_run(ours.dense), t)
        report(row)

    if group == "chunk":
        # Chunked prefill: one request's new chunk against its cached prefix. Its query tiles
        # cannot fill the GPU, so the heuristic splits each tile's KV range (Eq. 18) and a combine
        # kernel merges the partials; the row also times the call with splitting turned off
        # (the problem's tuning.num_splits = 1, workspace sized for it) and compares the outputs.
        for lq, lkv in chunk_shapes(args):
            b = Batch([lq], [lkv])
            ours = Ours(lib, b)
            ref = b.poisoned_run(ours.dense)
            t = median_ms(ours.dense)
            b.problem.tuning.num_splits = 1
            try:
                unsplit = Ours(lib, b)
                err_unsplit = rel_err(b.poisoned_run(unsplit.dense), ref)
                t_unsplit = median_ms(unsplit.dense)
            finally:
                b.problem.tuning.num_splits = 0
            row = dict(row="chunk", len_q=lq, len_kv=lkv, ours_ms=t, ours_tflops=tflops(b, t),
                       unsplit_ms=t_unsplit, split_speedup=t_unsplit / t, unsplit_relerr=err_unsplit)
            add_lower_right_baselines(row, b, ref, t)
            report(row)
            del b, ours, unsplit
            empty_cache()


if __name__ == "__main__":
    sys.exit(main())
