"""Compares two or more builds of the library: all builds in one process, on the same buffers,
timed in interleaved rounds (scripts/gpu_check.sh runs it with FP_BASELINE_LIB).

Why: separate processes see different allocations and a GPU whose clocks drift with its power
draw; on the H200 that spreads one build's sparse rows by 5-10 % from call to call, more than
most kernel changes are worth. Here every round times each build once (common.median_ms with
a 0.3 s warm-up, the order rotating from round to round), so drift hits all builds alike, and
each row reports the median over rounds of every build's time divided by the first build's time
in the same round, with the spread of that ratio (its lower and upper quartiles).

Every row first runs each build once into a NaN-poisoned output and reports the largest relative
L2 difference between the builds' outputs and whether every output is finite; the timing runs
on fresh random inputs drawn from a fixed seed, so every build sees the same q/k/v and masks.

Rows (L = sequence length, B = 1, Hq = 32, Hkv = 8, D = 128 or --head-dim 64, causal, bf16):
  dense   ours at L = 8K, 32K, 128K (--lengths), with cuDNN (SDPA) timed in the same rounds.
  sparse  L = 32K (the second of --lengths), random 128x128 block masks at rho 50/20/10/5 %
          (diagonal forced), with and without mean correction; also time / (density x the
          build's dense time at that length).
  sparse128k  L = 128K, random block masks at rho 5 % and 1.5 % (the demo's density at 128K),
          with and without mean correction.
  paged   dense L = 32K on paged caches (bench_attention.PagedView, every build on the same
          pool): bench_attention.PAGED_ROWS (pages of 1-128 keys shuffled, some in order or in
          runs of 1024 keys);
          the contiguous row first, with each build's paged / contiguous time.
  batch   dense B = 4 at 32K, and the mixed batch with cached prefixes of bench_attention.py.
  fp8     dense e4m3 (bench_fp8.Fp8Batch: per-tensor quantized q/k/v) at the second and third of
          --lengths, each build's bf16 dense on the dequantized inputs in the same rounds; also
          each build's bf16 time / its e4m3 time.

A build's single step (one timing, one checked run) that runs past --hang-s seconds (60) ends
the run with the row, the build and a traceback (hang_guard.py): a hung kernel costs a minute,
not the run's whole time limit. With --results DIR the rows also go into a results file
(bench/common.py), as the benchmarks' do.

Usage: python3 tools/compare_builds.py BASE=lib.so,NAME=lib.so[,...] [dense,sparse,...]
       [--rounds N] [--head-dim 64] [--hang-s S] [--results DIR]
       (rows: any of dense,sparse,sparse128k,paged,batch,fp8)
"""

import argparse
import pathlib
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import bench_attention as ba  # noqa: E402
import common  # noqa: E402
from common import median_ms  # noqa: E402
from hang_guard import guard  # noqa: E402

SEED = 1234
HANG_S = 60.0  # --hang-s: a build's single step (one timing, one checked run) that takes longer
               # than this ends the process (a hung kernel), naming the build and the row


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def paired(fns, rounds, reps, label=""):
    """{name: [ms per round]}: each round times every fn once, in an order rotating by round."""
    names = list(fns)
    out = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            n = names[(i + r) % len(names)]
            with guard(HANG_S, f"{label}: {n}, round {r}"):
                out[n].append(median_ms(fns[n], warmup=1, reps=reps, warmup_ms=300.0))
    return out


ROWS = []  # what report() printed, for --results


def report(label, times, extra=None):
    names = list(times)
    ROWS.append({"row": label, "ms": {n: statistics.median(t) for n, t in times.items()},
                 "ratio_to_first": {n: quartiles([t / b for t, b in zip(times[n], times[names[0]])])
                                    for n in names[1:]},
                 **({"extra": extra} if extra else {})})
    base = times[names[0]]
    cols = []
    for n in names:
        ratio = [t / b for t, b in zip(times[n], base)]
        lo, med, hi = quartiles(ratio)
        cols.append(f"{n}={statistics.median(times[n]):.4f}ms" +
                    ("" if n == names[0] else f" [{med:.3f} ({lo:.3f}-{hi:.3f})]") +
                    (f" {extra[n]}" if extra and n in extra else ""))
    print(f"{label:<26} " + "  ".join(cols), flush=True)


def check_outputs(batch, runs, label=""):
    """Runs each build once into a poisoned output: (largest relative L2 difference, all finite)."""
    outs = {}
    for n, fn in runs.items():
        with guard(HANG_S, f"{label}: {n}, checked run"):
            outs[n] = batch.poisoned_run(fn)
    names = list(outs)
    diff = max(ba.rel_err(outs[n], outs[names[0]]) for n in names)
    return diff, all(bool(torch.isfinite(o).all()) for o in outs.values())


def sparse_rows(b, ours, gen, rhos, rounds, reps, label, dense=None):
    """One row per (rho, correction): every build on the same random block mask; with `dense`
    (each build's dense time at this length), also time / (density x dense)."""
    L = b.len_q[0]
    for rho in rhos:
        mask = ba.random_block_mask(L, rho, gen)
        for corr in (0, 1):
            for o in ours.values():  # every build gets the same mask (and density)
                density = o.use_block_mask(mask, corr)
            row = f"{label} rho={rho} corr={corr}"
            diff, finite = check_outputs(b, {n: o.sparse for n, o in ours.items()}, row)
            t = paired({n: o.sparse for n, o in ours.items()}, rounds, reps, row)
            extra = None
            if dense:
                extra = {n: f"(/rho dense {statistics.median(t[n]) / (density * dense[n]):.3f})"
                         for n in ours}
            report(row, t, extra)
            print(f"{'':<26} density={density:.4f} maxdiff={diff:.1e} finite={finite}", flush=True)


def main():
    global HANG_S
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("libs", help="NAME=path[,NAME=path...]; the first is the base of the ratios, "
                                 "the package runs on the last")
    ap.add_argument("rows", nargs="?", default="dense,sparse")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--head-dim", type=int, default=ba.D, choices=(64, 128))
    ap.add_argument("--hang-s", type=float, default=HANG_S,
                    help="seconds one step of one build may take before the run stops as hung")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: the CPU reference, no cuDNN (a smoke run of the code paths)")
    ap.add_argument("--lengths", default="8192,32768,131072",
                    help="the dense rows' lengths; the sparse rows run at the second")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="also write the rows into a results file in DIR")
    args = ap.parse_args()
    started = common.utc_now()
    HANG_S = args.hang_s
    ba.D = args.head_dim  # every batch, baseline and FLOP count below reads it
    ba.DEV = common.DEVICE = args.device
    pairs = [a.split("=", 1) for a in args.libs.split(",")]
    # The last build (the newest, by convention) also makes the block-mask indexes and means
    # through the package: the same arrays for every build.
    common.load_package(pairs[-1][1])
    libs = {name: ba.Lib(path) for name, path in pairs}
    results = common.ResultsFile(args.results, "compare", started) if args.results else None
    rows = args.rows.split(",")
    torch.manual_seed(SEED)
    gen = torch.Generator(device=args.device)
    gen.manual_seed(SEED)
    print(f"paired rounds={args.rounds}; [median (quartiles)] of time / {next(iter(libs))}'s "
          "time in the same round", flush=True)
    lengths = [int(x) for x in args.lengths.split(",")]
    mid = lengths[1] if len(lengths) > 1 else lengths[0]  # the sparse and paged rows' length
    dense32 = {}
    if "dense" in rows:
        for L in lengths:
            reps = 9 if L <= 8192 else 5 if L <= 32768 else 3
            rounds = args.rounds if L <= 32768 else max(3, args.rounds // 3)
            b = ba.Batch([L], [L])
            ours = {n: ba.Ours(lib, b) for n, lib in libs.items()}
            diff, finite = check_outputs(b, {n: o.dense for n, o in ours.items()}, f"dense L={L}")
            fns = {n: o.dense for n, o in ours.items()}
            if args.device == "cuda":
                fns["cudnn"] = ba.sdpa(b, SDPBackend.CUDNN_ATTENTION)
            t = paired(fns, rounds, reps, f"dense L={L}")
            if L == mid:
                dense32 = {n: statistics.median(t[n]) for n in libs}
            extra = None
            if "cudnn" in t:
                cudnn = statistics.median(t["cudnn"])
                extra = {n: f"{cudnn / statistics.median(t[n]):.3f}x cudnn" for n in libs}
            report(f"dense L={L}", t, extra)
            print(f"{'':<26} maxdiff={diff:.1e} finite={finite}", flush=True)
            del b, ours
            ba.empty_cache()
    if "sparse" in rows:
        b = ba.Batch([mid], [mid])
        ours = {n: ba.Ours(lib, b) for n, lib in libs.items()}
        if not dense32:
            times = paired({n: o.dense for n, o in ours.items()}, 3, 5, f"dense L={mid}")
            dense32 = {n: statistics.median(v) for n, v in times.items()}
        sparse_rows(b, ours, gen, (0.5, 0.2, 0.1, 0.05), args.rounds, 15, "sparse", dense32)
        del b, ours
        ba.empty_cache()
    if "sparse128k" in rows:
        b = ba.Batch([131072], [131072])
        ours = {n: ba.Ours(lib, b) for n, lib in libs.items()}
        sparse_rows(b, ours, gen, (0.05, 0.015), args.rounds, 5, "sparse L=128K")
        del b, ours
        ba.empty_cache()
    if "paged" in rows:
        b = ba.Batch([mid], [mid])
        ours = {n: ba.Ours(lib, b) for n, lib in libs.items()}
        diff, finite = check_outputs(b, {n: o.dense for n, o in ours.items()}, "contiguous")
        t = paired({n: o.dense for n, o in ours.items()}, args.rounds, 5, "contiguous")
        contiguous = {n: statistics.median(t[n]) for n in libs}
        report("paged contiguous", t)
        print(f"{'':<26} maxdiff={diff:.1e} finite={finite}", flush=True)
        for page_size, order in ba.PAGED_ROWS:
            view = ba.PagedView(b, page_size, gen, order)
            runs = {n: o.dense_paged(view) for n, o in ours.items()}
            row = f"paged {page_size} {order}"
            diff, finite = check_outputs(b, runs, row)
            t = paired(runs, args.rounds, 5, row)
            report(row, t, {n: f"({statistics.median(t[n]) / contiguous[n]:.3f} contig)"
                            for n in libs})
            print(f"{'':<26} maxdiff={diff:.1e} finite={finite}", flush=True)
            del view, runs
    if "batch" in rows:
        for len_q, len_kv in (([32768] * 4, [32768] * 4),
                              ([2048, 512, 8192, 1024], [32768, 16384, 8192, 65536])):
            b = ba.Batch(len_q, len_kv)
            ours = {n: ba.Ours(lib, b) for n, lib in libs.items()}
            row = f"batch {len(len_q)} x {max(len_kv) // 1024}K" if len(set(len_kv)) == 1 \
                else "batch mixed, prefixes"
            diff, finite = check_outputs(b, {n: o.dense for n, o in ours.items()}, row)
            t = paired({n: o.dense for n, o in ours.items()}, args.rounds, 3, row)
            report(row, t, {n: f"({ba.tflops(b, statistics.median(t[n])):.0f} TFLOP/s)"
                            for n in libs})
            print(f"{'':<26} maxdiff={diff:.1e} finite={finite}", flush=True)
            del b, ours
            ba.empty_cache()
    if "fp8" in rows and args.device == "cuda":
        import bench_fp8  # torch's float8 types; the CPU reference takes no part here
        for L in lengths[1:] or lengths:
            reps = 5 if L <= 32768 else 3
            rounds = args.rounds if L <= 32768 else max(3, args.rounds // 3)
            x = [torch.randn(L, h, ba.D, device=ba.DEV, dtype=torch.bfloat16)
                 for h in (ba.HQ, ba.HKV, ba.HKV)]
            f = bench_fp8.Fp8Batch(*x)
            ours8 = {n: ba.Ours(lib, f.batch) for n, lib in libs.items()}
            ours16 = {n: ba.Ours(lib, f.dequantized) for n, lib in libs.items()}
            row = f"fp8 dense L={L}"
            diff, finite = check_outputs(f.batch, {n: o.dense for n, o in ours8.items()}, row)
            fns = {f"{n}:e4m3": o.dense for n, o in ours8.items()}
            fns.update({f"{n}:bf16": o.dense for n, o in ours16.items()})
            t = paired(fns, rounds, reps, row)
            extra = {f"{n}:e4m3": "({:.3f}x bf16, {:.0f} TFLOP/s)".format(
                statistics.median(t[f"{n}:bf16"]) / statistics.median(t[f"{n}:e4m3"]),
                ba.tflops(f.batch, statistics.median(t[f"{n}:e4m3"]))) for n in libs}
            report(row, t, extra)
            print(f"{'':<26} maxdiff={diff:.1e} finite={finite}", flush=True)
            del f, ours8, ours16, x
            ba.empty_cache()
    if results:
        print("results:", results.write(ROWS, complete=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
