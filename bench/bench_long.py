"""Long prefills in bounded memory: fp_prefill of one request at Hq = 32, Hkv = 8, D = 128, bf16.

Two row groups, written to one results file (bench/common.py ResultsFile, bench "long"):

- `long_ranges` (--compare-length, default 64K): fp_prefill with the workspace the size query
  asks for (one query-tile range at this length), with the least workspace the call accepts (ranges
  of one query tile) and with a few tiles more than that (ranges of several tiles, the last one
  shorter), and fp_build_index + fp_sparse_attention (the whole index): every output is compared
  bit for bit with the first (docs/ALGORITHM.md, "Sizes and the prefill workspace"). On one
  request, a varlen batch and a paged cache; each once with the split heuristic's choice and once
  with 3 splits (the problem's tuning.num_splits; split partials combined once after the last
  range). Each output is written into a NaN-poisoned buffer.
- `long` (--lengths, default 1M): the time of fp_prefill (default config), its workspace, the
  peak of device memory over the call (torch.cuda.max_memory_allocated, with and without the
  inputs and output; the library allocates nothing itself), and
  its rows in a few query slices (the first, middle and last --rows queries) against
  fp_dense_attention on those rows only (a problem of those queries over the keys up to the
  slice's end; the same bottom-right causal alignment). At alpha = 0 the prefill is dense
  attention, so its rows must match within the bf16 tolerance (1e-2, docs/ALGORITHM.md); the
  default config's distance is the sparsity's.

The workload, made on the GPU: normal q, k, v (std 1, 0.5, 1) plus one shared direction u, 6 u in
every query and in every key of every 16th 128-key block, so that those blocks stand 3.2 nats above
the others: the selection keeps them, the sink, the window and the diagonal (about 7 % of the
causal tiles at 1M).

    python3 bench/bench_long.py --lib build/libflashprefill.so --results bench/results
"""

import argparse
import copy
import ctypes
import re
import sys
import time

import torch

import bench_attention
import common
from bench_attention import HKV, HQ, D, Batch, Lib, Ours, PagedView, rel_err, sync

FP_ERROR_WORKSPACE_TOO_SMALL = 3
HEAVY_EVERY = 16      # every 16th block of keys carries the shared direction
HEAVY_AMPLITUDE = 6.0
BF16_TOLERANCE = 1e-2
DEV = "cuda"  # --device cpu: the same rows on the library's CPU path (a smoke run at small lengths)


def workload(L, gen, chunk=1 << 16):
    """q [L, HQ, D], k and v [L, HKV, D] in bf16 on the GPU (the module docstring's workload)."""
    u = torch.randn(D, device=DEV, generator=gen)
    u = (u / u.norm()).to(torch.bfloat16)
    q = torch.empty(L, HQ, D, device=DEV, dtype=torch.bfloat16)
    k = torch.empty(L, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(L, HKV, D, device=DEV, dtype=torch.bfloat16, generator=gen)
    for t0 in range(0, L, chunk):
        t1 = min(L, t0 + chunk)
        q[t0:t1] = torch.randn(t1 - t0, HQ, D, device=DEV, dtype=torch.bfloat16,
                               generator=gen) + HEAVY_AMPLITUDE * u
        k[t0:t1] = 0.5 * torch.randn(t1 - t0, HKV, D, device=DEV, dtype=torch.bfloat16,
                                     generator=gen)
    block = torch.arange(L, device=DEV) // 128
    heavy = (block % HEAVY_EVERY) == HEAVY_EVERY // 2
    k[heavy] += HEAVY_AMPLITUDE * u
    return q, k, v


class Prefill:
    """fp_prefill on a batch through ctypes, with a workspace of a chosen size."""

    def __init__(self, lib, batch, config):
        self.lib, self.b, self.config = lib, batch, config
        batch.bind_stream()

    def size_query(self):
        return self.lib.size(self.lib.lib.fp_prefill_workspace_size,
                             ctypes.byref(self.b.problem), ctypes.byref(self.config))

    def least(self):
        """The least workspace the call accepts, as the call itself reports it."""
        status = self.lib.lib.fp_prefill(ctypes.byref(self.b.problem), ctypes.byref(self.config),
                                         ctypes.byref(self.b.output), None, ctypes.c_size_t(0))
        message = self.lib.lib.fp_last_error_message().decode()
        found = re.search(r"needs (\d+)", message)
        if status != FP_ERROR_WORKSPACE_TOO_SMALL or found is None:
            raise RuntimeError(f"expected a workspace-too-small status, got {status}: {message}")
        return int(found.group(1))

    def runner(self, nbytes):
        ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=DEV)

        def run():
            self.lib.check(self.lib.lib.fp_prefill(
                ctypes.byref(self.b.problem), ctypes.byref(self.config),
                ctypes.byref(self.b.output), ctypes.c_void_p(ws.data_ptr()),
                ctypes.c_size_t(nbytes)))
        return run


def range_cases(L, gen):
    """The batches whose ranged prefills are compared: one request of L tokens; a varlen batch of
    chunks (L_q <= L_kv, one empty request); the first in a paged cache of 16-key pages placed in
    shuffled order."""
    q, k, v = workload(L, gen)
    one = Batch([L], [L], q, k, v)
    len_q = [L // 2, 0, L // 8, L // 4 + 3]
    len_kv = [L // 2, 7, L // 4, L // 4 + 3]
    vq, vk, vv = workload(sum(len_kv), gen)
    varlen = Batch(len_q, len_kv, vq[:sum(len_q)], vk, vv)
    paged = copy.copy(one)
    paged.view = PagedView(one, 16, gen)
    paged.problem = paged.view.problem
    return [("contiguous", one), ("varlen", varlen), ("paged 16", paged)]


def range_rows(lib, L, gen, report):
    cfg = lib.config()
    per_tile = 4 * HKV * ((L + 63) // 64)  # index entries of one more query tile, in bytes
    for layout, b in range_cases(L, gen):
        tiles = (HQ // HKV * max(b.len_q) + 127) // 128
        for splits in (0, 3):  # 0: the heuristic
            b.problem.tuning.num_splits = splits
            pre = Prefill(lib, b, cfg)
            full, least = pre.size_query(), pre.least()
            start = time.perf_counter()
            reference = b.poisoned_run(pre.runner(full))
            sync()
            full_ms = (time.perf_counter() - start) * 1e3
            variants = {}
            start = time.perf_counter()
            variants["least"] = b.poisoned_run(pre.runner(least))
            sync()
            least_ms = (time.perf_counter() - start) * 1e3
            variants["few_tiles"] = b.poisoned_run(pre.runner(least + 6 * per_tile))
            ours = Ours(lib, b)
            build = ours.build_index(cfg)
            variants["staged"] = b.poisoned_run(lambda: (build(), ours.sparse()))
            row = dict(row="long_ranges", L=L, layout=layout, splits=str(splits or "heuristic"),
                       query_tiles=tiles, workspace_bytes=full, least_workspace_bytes=least,
                       full_ms=full_ms, least_ms=least_ms,
                       finite=bool(torch.isfinite(reference).all().item()))
            for name, out in variants.items():
                row[f"identical_{name}"] = bool(torch.equal(out, reference))
            row["ok"] = row["finite"] and all(row[f"identical_{n}"] for n in variants)
            report(row)
            del ours, build, variants, reference
            bench_attention.empty_cache()


def slice_error(lib, q, k, v, out, r0, r1):
    """Relative L2 distance of out[r0:r1] to fp_dense_attention of queries r0 .. r1 - 1 over the
    keys 0 .. r1 - 1 (bottom-right aligned: query r0 + i sees keys up to r0 + i)."""
    s = Batch([r1 - r0], [r1], q[r0:r1], k[:r1], v[:r1])
    Ours(lib, s).dense()
    sync()
    return rel_err(out[r0:r1], s.out)


def long_rows(lib, L, rows, gen, report, reps):
    q, k, v = workload(L, gen)
    b = Batch([L], [L], q, k, v)
    slices = [(0, rows), (L // 2 - rows // 2, L // 2 + rows // 2), (L - rows, L)]
    for alpha in (0.1, 0.0):
        cfg = lib.config(alpha=alpha)
        pre = Prefill(lib, b, cfg)
        nbytes = pre.size_query()
        sync()
        cuda = DEV == "cuda"
        inputs = torch.cuda.memory_allocated() if cuda else 0  # q, k, v, output, metadata
        run = pre.runner(nbytes)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        b.out.fill_(float("nan"))
        start = time.perf_counter()
        run()
        sync()
        first_ms = (time.perf_counter() - start) * 1e3
        peak = torch.cuda.max_memory_allocated() if cuda else None
        free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
        finite = bool(torch.isfinite(b.out).all().item())
        errors = [slice_error(lib, q, k, v, b.out, r0, r1) for r0, r1 in slices]
        ms = common.median_ms(run, warmup=1, reps=reps, warmup_ms=0.0) if alpha > 0 else None
        row = dict(row="long", L=L, alpha=alpha, heads_q=HQ, heads_kv=HKV, head_dim=D,
                   dtype="bfloat16", ms=ms, first_call_ms=first_ms, workspace_bytes=nbytes,
                   peak_bytes=peak, peak_beyond_inputs_bytes=peak - inputs if cuda else None,
                   device_used_bytes=total - free if cuda else None,
                   checked_rows=[list(s) for s in slices],
                   err_rows=max(errors), finite=finite)
        if alpha == 0:
            row["ok"] = finite and row["err_rows"] <= BF16_TOLERANCE
        report(row)
        del run
        bench_attention.empty_cache()


def main():
    started = common.utc_now()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libflashprefill.so")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="write the run's results file into DIR, e.g. bench/results")
    ap.add_argument("--compare-length", type=int, default=65536)
    ap.add_argument("--lengths", default="1048576")
    ap.add_argument("--rows", type=int, default=256, help="queries per checked slice")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per length")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    global DEV
    DEV = bench_attention.DEV = common.DEVICE = args.device
    common.load_package(args.lib)
    lib = Lib(args.lib)
    gen = torch.Generator(device=DEV)
    gen.manual_seed(0)
    rows = []
    results = common.ResultsFile(args.results, "long", started) if args.results else None
    print(f"# {common.machine()}  torch {torch.__version__}", flush=True)

    report = common.reporter(rows, results)

    if args.compare_length > 0:
        range_rows(lib, args.compare_length, gen, report)
    for L in (int(x) for x in args.lengths.split(",") if x):
        long_rows(lib, L, args.rows, gen, report, args.reps)
    if results:
        print("results:", results.write(rows, complete=True))
    failed = [r for r in rows if r.get("ok") is False]
    for r in failed:
        print("FAILED:", r, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
