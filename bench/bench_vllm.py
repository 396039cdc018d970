"""The vLLM backend's library calls on CUDA (flashprefill.vllm.batch; vLLM itself is not needed).

Chunk index rows (`vllm_chunk_index`): a long prompt (default 128K keys, Hq = 32, Hkv = 8,
D = 128, bf16) prefilled in chunks (default 8K); for every chunk, the index stage over its KV in
vLLM's FLASH_ATTN cache layout (block size 16, blocks shuffled), default selection config:
    rebuild       fp_build_index: pools every block of the chunk's keys, then scores and selects
                  (what the backend does without kept means);
    kept          fp_pool_kv of the chunk's new blocks, then fp_build_index under
                  FP_FLAG_MEANS_POOLED (the library's part with kept means);
    kept_backend  the whole per-layer work of the backend with FLASHPREFILL_KEEP_MEANS=1: the
                  cache update's KeptMeans.invalidate, KeptMeans.gather, the two calls above and
                  KeptMeans.store (torch indexing on the device).
Prefill rows (`vllm_prefill`): the backend's prefill part, ForwardBatch.run on the FLASH_ATTN
cache with blocks in order and shuffled, against Plan.run of the same problem on contiguous K/V
(the library's contiguous call) in the same process: a whole prompt (default 32K) in dense and
in sparse mode, and the last chunk of the long prompt (sparse). Each row records the share of
128-key spans whose blocks lie in consecutive pool rows (batch.consecutive_span_share) and the
largest difference from the contiguous output.

Every time is common.median_ms (CUDA events over back-to-back calls after a second of warm-up).
The library calls of the chunk rows go through ctypes with prebuilt problems; the prefill rows go
through the backend's own Python path (its host work overlaps the queued GPU work). Prints the
rows; with --results writes the run's results file for bench/report.py.

Usage: python3 bench/bench_vllm.py [--lib build/libflashprefill.so] [--results bench/results]
                                   [--prompt 131072] [--chunk 8192] [--whole 32768]
                                   [--heads 32,8,128] [--device cpu]
--device cpu: the library's CPU reference at small sizes (prompt 2048, chunk 512, whole 1024,
heads 8,2,64): a smoke run of the code paths, not a measurement.
"""

import argparse
import ctypes
import json
import sys

import numpy as np
import torch

import common
from common import median_ms

PAGE = 16  # vLLM's default block size, FLASH_ATTN's smallest
SPAN = 128  # the fragmentation measure's span (keys)
SIZES = {"cuda": (131072, 8192, 32768, "32,8,128"), "cpu": (2048, 512, 1024, "8,2,64")}
fp = vb = None  # flashprefill and flashprefill.vllm.batch, once main() has loaded the library


class Cache:
    """K/V of one request of `length` keys, contiguous [L, Hkv, D] and in FLASH_ATTN's cache
    layout (a [num_blocks, block, Hkv, 2D] store; keys in the first D channels of a slot) with
    its blocks in order or shuffled."""

    def __init__(self, k, v, order, generator):
        self.k, self.v = k, v
        length, heads, dim = k.shape
        blocks = -(-length // PAGE)
        if order == "shuffled":
            table = torch.randperm(blocks, generator=generator)
        else:
            table = torch.arange(blocks)
        store = torch.zeros(blocks, PAGE, heads, 2 * dim, dtype=k.dtype, device=k.device)
        self.key_cache, self.value_cache = vb.kv_views(store.transpose(1, 2), dim)
        slots = table.to(k.device).repeat_interleave(PAGE)[:length] * PAGE + (
            torch.arange(length, device=k.device) % PAGE)
        vb.write_kv(k, v, self.key_cache, self.value_cache, slots)
        self.table = table.to(torch.int32)[None].to(k.device)
        self.order = order

    def spans(self, length):
        consecutive, total = vb.consecutive_span_share(self.table, [length], PAGE, SPAN)
        return consecutive / total if total else None


def forward_batch(settings, len_q, len_kv, cache):
    device = cache.k.device
    cu = torch.tensor([0, len_q], dtype=torch.int32)
    seq_lens = torch.tensor([len_kv], dtype=torch.int32)
    return vb.ForwardBatch(settings, cu.to(device), seq_lens.to(device), cache.table,
                           query_start_loc_cpu=cu, seq_lens_cpu=seq_lens)


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: status {status}: "
                           f"{fp._lib.lib.fp_last_error_message().decode()}")


def chunk_index_rows(q_all, cache, prompt, chunk, settings, results, rows):
    """The `vllm_chunk_index` rows, one per chunk (see the module docstring)."""
    from flashprefill._index import query_sizes
    from flashprefill._problem import PagedKV, build_problem
    lib, byref = fp._lib.lib, ctypes.byref
    config = settings.select_config()
    c_config = config.to_c()
    kept = vb.KeptMeans(cache.key_cache, config.block_size, config.mean_correction)
    on_cuda = common.DEVICE == "cuda"
    device = q_all.device
    for c in range(prompt // chunk):
        start, len_kv = c * chunk, (c + 1) * chunk
        q = q_all[start:len_kv]
        seqlens = torch.tensor([len_kv], dtype=torch.int32, device=device)
        cu_q = torch.tensor([0, chunk], dtype=torch.int32, device=device)
        problem = build_problem(q, PagedKV(cache.key_cache, cache.value_cache, cache.table,
                                           seqlens), None, None, cu_q, None, chunk, len_kv,
                                validate_metadata=False)
        plain = problem.c
        pooled = type(plain).from_buffer_copy(plain)
        pooled.flags |= fp._lib.FLAG_MEANS_POOLED
        sizes = query_sizes(problem, config)
        nbytes = ctypes.c_size_t()
        check(lib.fp_build_index_workspace_size(byref(plain), byref(c_config), byref(nbytes)),
              "workspace size")
        ws = torch.empty(max(nbytes.value, 1), dtype=torch.uint8, device=device)
        cu = torch.empty(sizes.num_segments + 1, dtype=torch.int32, device=device)
        idx = torch.empty(max(sizes.idx_capacity, 1), dtype=torch.int32, device=device)
        shape = (1, plain.num_heads_kv, sizes.max_blocks, plain.head_dim)
        k_mean = torch.empty(shape, dtype=torch.float32, device=device)
        v_mean = torch.empty_like(k_mean) if config.mean_correction else None
        pooled_keys = torch.tensor([start], dtype=torch.int32, device=device)

        def index_of(k_mean, v_mean):
            return fp._lib.Index(cu.data_ptr(), idx.data_ptr(), k_mean.data_ptr(),
                                 None if v_mean is None else v_mean.data_ptr(), idx.shape[0])

        index = index_of(k_mean, v_mean)

        def stream():
            if on_cuda:
                plain.stream = pooled.stream = torch.cuda.current_stream().cuda_stream

        def build(problem_c):
            check(lib.fp_build_index(byref(problem_c), byref(c_config), byref(index),
                                     ws.data_ptr(), ws.numel()), "fp_build_index")

        def rebuild():
            stream()
            build(plain)

        def pool(problem_c, means, keys):
            check(lib.fp_pool_kv(byref(problem_c), byref(c_config), means[0].data_ptr(),
                                 None if means[1] is None else means[1].data_ptr(),
                                 None if keys is None else keys.data_ptr()), "fp_pool_kv")

        def kept_library():
            stream()
            pool(plain, (k_mean, v_mean), pooled_keys)
            build(pooled)

        pool(plain, (k_mean, v_mean), None)  # the earlier chunks' blocks, as kept
        new_slots = (cache.table[0].to(torch.int64).repeat_interleave(PAGE)[start:len_kv] * PAGE
                     + torch.arange(start, len_kv, device=device) % PAGE)
        mean_rows = kept.rows(cache.table, seqlens, sizes.max_blocks)
        means, _ = kept.gather(mean_rows)
        pool(plain, means, None)
        kept.store(mean_rows, means)

        def kept_backend():
            stream()
            kept.invalidate(new_slots)
            means, keys = kept.gather(mean_rows)
            pool(plain, means, keys)
            check(lib.fp_build_index(byref(pooled), byref(c_config),
                                     byref(index_of(*means)), ws.data_ptr(), ws.numel()),
                  "fp_build_index")
            kept.store(mean_rows, means)

        _, taken = kept.gather(mean_rows)
        assert int(taken[0]) == len_kv // config.block_size * config.block_size
        kept.invalidate(new_slots)  # the chunk's cache update: its blocks are stale
        _, taken = kept.gather(mean_rows)
        row = {"row": "vllm_chunk_index", "chunk": c, "len_q": chunk, "len_kv": len_kv,
               "page_size": PAGE, "pages": cache.order, "heads_q": plain.num_heads_q,
               "heads_kv": plain.num_heads_kv, "head_dim": plain.head_dim,
               "pooled_keys": start, "kept_keys_taken": int(taken[0]),
               "rebuild_ms": median_ms(rebuild), "kept_ms": median_ms(kept_library),
               "kept_backend_ms": median_ms(kept_backend)}
        row["kept_vs_rebuild"] = row["kept_ms"] / row["rebuild_ms"]
        row["kept_backend_vs_rebuild"] = row["kept_backend_ms"] / row["rebuild_ms"]
        rows.append(row)
        if results:
            results.write(rows)
        print(json.dumps(row), flush=True)


def prefill_rows(label, q, len_kv, caches, settings, dense, results, rows):
    """One `vllm_prefill` row: ForwardBatch.run on each paged cache against Plan.run on the
    contiguous K/V of its first len_kv keys."""
    len_q = q.shape[0]
    contiguous = caches[0]
    k, v = contiguous.k[:len_kv], contiguous.v[:len_kv]
    heads_q, dim = q.shape[1], q.shape[2]
    scale = 1.0 / dim ** 0.5
    cu_q = torch.tensor([0, len_q], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, len_kv], dtype=torch.int32, device=q.device)
    plan = fp.Plan(heads_q, k.shape[1], dim, q.dtype, q.device, cu_q, len_q, len_kv,
                   cu_seqlens_k=cu_k, softmax_scale=scale,
                   config=None if dense else settings.select_config(), dense=dense,
                   validate_metadata=False)
    out = torch.empty_like(q)
    reference = plan.run(q, k, v).float()
    row = {"row": "vllm_prefill", "shape": label, "mode": "dense" if dense else "sparse",
           "len_q": len_q, "len_kv": len_kv, "page_size": PAGE, "heads_q": heads_q,
           "heads_kv": k.shape[1], "head_dim": dim,
           "contiguous_ms": median_ms(lambda: plan.run(q, k, v, out=out))}
    for cache in caches:
        batch = forward_batch(settings, len_q, len_kv, cache)
        assert [p.dense for p in batch.parts] == [dense]
        paged = torch.empty_like(q)
        batch.run(q, cache.key_cache, cache.value_cache, paged, scale)
        row[f"{cache.order}_ms"] = median_ms(
            lambda: batch.run(q, cache.key_cache, cache.value_cache, paged, scale))
        row[f"{cache.order}_vs_contiguous"] = row[f"{cache.order}_ms"] / row["contiguous_ms"]
        row[f"{cache.order}_consecutive_spans"] = cache.spans(len_kv)
        row[f"{cache.order}_max_abs_diff"] = float((paged.float() - reference).abs().max())
    rows.append(row)
    if results:
        results.write(rows)
    print(json.dumps(row), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default="build/libflashprefill.so")
    parser.add_argument("--results", default=None, metavar="DIR",
                        help="write the run's results file into DIR, e.g. bench/results")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--prompt", type=int, help="keys of the chunked prompt")
    parser.add_argument("--chunk", type=int, help="tokens per chunk (a divisor of --prompt)")
    parser.add_argument("--whole", type=int, help="tokens of the whole-prompt prefill rows")
    parser.add_argument("--heads", help="Hq,Hkv,D")
    args = parser.parse_args()
    defaults = SIZES[args.device]
    prompt = args.prompt or defaults[0]
    chunk = args.chunk or defaults[1]
    whole = args.whole or defaults[2]
    heads_q, heads_kv, dim = (int(x) for x in (args.heads or defaults[3]).split(","))
    if prompt % chunk or whole > prompt:
        parser.error("--chunk must divide --prompt, and --whole be at most --prompt")
    started = common.utc_now()
    common.DEVICE = args.device
    global fp, vb
    fp = common.load_package(args.lib)
    from flashprefill.vllm import batch as vb
    if args.device == "cuda" and not fp.cuda_available():
        sys.exit("bench_vllm: the library has no CUDA path here or sees no sm_90 GPU")
    print(f"device: {common.machine()}, torch {torch.__version__}", flush=True)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    q_all = torch.randn(prompt, heads_q, dim, generator=generator).to(device, dtype)
    k = torch.randn(prompt, heads_kv, dim, generator=generator).to(device, dtype)
    v = torch.randn(prompt, heads_kv, dim, generator=generator).to(device, dtype)
    caches = [Cache(k, v, order, generator) for order in ("in_order", "shuffled")]
    sparse = vb.Settings(min_sparse_len=0)
    dense = vb.Settings(min_sparse_len=prompt + 1)
    results = common.ResultsFile(args.results, "vllm", started) if args.results else None
    rows = []
    prefill_rows("whole prompt", q_all[:whole], whole, caches, dense, True, results, rows)
    prefill_rows("whole prompt", q_all[:whole], whole, caches, sparse, False, results, rows)
    prefill_rows("last chunk", q_all[prompt - chunk:], prompt, caches, sparse, False, results,
                 rows)
    chunk_index_rows(q_all, caches[1], prompt, chunk, sparse, results, rows)
    if results:
        print("results:", results.write(rows, complete=True))
    index = [r for r in rows if r["row"] == "vllm_chunk_index"]
    print(f"{'chunk':>5} {'L_kv':>7} {'rebuild':>10} {'kept':>10} {'kept+cache':>11} {'ratio':>6}")
    for r in index:
        print(f"{r['chunk']:>5} {r['len_kv']:>7} {r['rebuild_ms']:>8.3f}ms {r['kept_ms']:>8.3f}ms "
              f"{r['kept_backend_ms']:>9.3f}ms {r['kept_backend_vs_rebuild']:>6.3f}")
    totals = [sum(r[key] for r in index) for key in ("rebuild_ms", "kept_ms", "kept_backend_ms")]
    print(f"{'all':>5} {prompt:>7} {totals[0]:>8.3f}ms {totals[1]:>8.3f}ms {totals[2]:>9.3f}ms "
          f"{totals[2] / totals[0]:>6.3f}")
    for r in (r for r in rows if r["row"] == "vllm_prefill"):
        print(f"{r['shape']} ({r['mode']}, {r['len_q']} / {r['len_kv']}): contiguous "
              f"{r['contiguous_ms']:.3f} ms, in order {r['in_order_vs_contiguous']:.3f}x, "
              f"shuffled {r['shuffled_vs_contiguous']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
