"""The errors of the CPU FP8 e4m3 reference (docs/ALGORITHM.md "FP8 e4m3"), beside bfloat16's.

For each input kind: relative L2 error of the library's output against float64 attention
(python/tests/conftest.py reference_attention) on the dequantized inputs and on the unquantized
float32 inputs, for e4m3 q/k/v, for a bfloat16 q over the e4m3 KV cache (q quantized by the
library) and for bfloat16 q/k/v; the prefill (alpha 0.1, sink and window of 64 and 128 keys,
so that it is sparse at this length) with and without mean correction, e4m3 beside bfloat16;
and how far three other readings of Eq. 15 land from the reference (the final row
maximum instead of the running one; the unrounded probabilities in the denominator; the rounded
ones summed as the CUDA kernel sums them, in fp16 within a stage: fp16_stage_sums), as a kernel
whose stages or sums differ would. The first two against the library's output (rounded to
bfloat16); the fp16 sums against the same reading summed in float64, since their effect is far
below that rounding.

    PYTHONPATH=python FLASHPREFILL_LIB=build/libflashprefill.so python3 scripts/fp8_errors.py
"""

import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, "python/tests")
import flashprefill as fp  # noqa: E402
from conftest import random_qkv, reference_attention, rel_l2, structured_qkv  # noqa: E402

E4M3, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16


def quantize(x):
    c = np.float32(np.abs(x).max() / 448)
    return np.clip(x * (np.float32(1) / c), -448, 448).astype(E4M3), float(c)


def fp16_stage_sums(p):
    """A stage's rounded probabilities p (up to 128 keys, from its first key) summed as the CUDA
    kernel's four threads of a row do (fp8.hpp convert_p_e4m3): thread t holds keys 2t + c + 8a +
    16i + 32k (a, c, i in {0, 1}, k < 4); the pairs a = 0 and a = 1 are added in fp16 (a half2 per
    (i, k), c its lanes), those eight half2 pairwise in fp16 (j + 4, j + 2, j + 1 onto j, j = i +
    2k), the two lanes then in float32. Returns the four threads' float32 sums."""
    x = np.zeros(128)
    x[:p.size] = p
    sums = []
    for t in range(4):
        pair = []
        for k in range(4):
            for i in range(2):
                base = 2 * t + 16 * i + 32 * k
                lo, hi = x[base:base + 2], x[base + 8:base + 10]
                pair.append((lo.astype(np.float16) + hi.astype(np.float16)).astype(np.float16))
        for width in (4, 2, 1):
            pair = [(pair[j] + pair[j + width]).astype(np.float16) for j in range(width)]
        h = pair[0].astype(np.float32)
        sums.append(np.float32(h[0] + h[1]))
    return np.array(sums, dtype=np.float32)


def eq15_variant(q8, k8, v8, c, scale, final_max, rounded_sum):
    """Eq. 15 in float64 with ml_dtypes rounding (dense, one request, per-tensor descales).
    rounded_sum: the denominator sums the rounded probabilities (True), the exact ones (False),
    or the rounded ones as the CUDA kernel does ("fp16": fp16_stage_sums, each thread's running
    sum and their total in float32)."""
    q, k, v = (x.astype(np.float32).astype(np.float64) for x in (q8, k8, v8))
    len_q, heads_q, _ = q.shape
    len_kv, heads_kv, _ = k.shape
    g = heads_q // heads_kv
    s_log2 = scale * c[0] * c[1] / np.log(2)
    out = np.zeros(q.shape)
    for h in range(heads_q):
        s_all = q[:, h] @ k[:, h // g].T * s_log2
        for i in range(len_q):
            pos = len_kv - len_q + i
            s_row = s_all[i, :pos + 1]
            chunks = [(0, pos + 1)] if final_max else [
                (a * 128, min(a * 128 + 128, pos + 1)) for a in range(pos // 128, -1, -1)]
            m, l, acc = -np.inf, 0.0, 0.0
            lanes = np.zeros(4, dtype=np.float32)  # "fp16": the four threads' running sums
            for a, b in chunks:
                s = s_row[a:b]
                m_new = max(m, s.max())
                exact = np.exp2(s - m_new + 8)
                p = exact.astype(np.float32).astype(E4M3).astype(np.float64)
                r = np.exp2(m - m_new)
                if rounded_sum == "fp16":
                    lanes = lanes * np.float32(r) + fp16_stage_sums(p)
                else:
                    l = l * r + (p.sum() if rounded_sum else exact.sum())
                acc = acc * r + p @ v[a:b, h // g]
                m = m_new
            if rounded_sum == "fp16":
                l = float((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
            out[i, h] = c[2] * acc / l
    return out


def main():
    rng = np.random.default_rng(20261201)
    L = 1024
    print("| inputs | D | e4m3 q/k/v vs float64 on dequantized | e4m3 q/k/v vs float64 on "
          "unquantized | bf16 q over e4m3 KV vs unquantized | bf16 vs unquantized | prefill vs "
          "unquantized, corrected / uncorrected: e4m3 (density) | bf16 (density) | "
          "final max instead of running | unrounded denominator | fp16 stage sums vs float64 sums |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in ("random", "structured"):
        for D in (64, 128):
            make = random_qkv if kind == "random" else structured_qkv
            q, k, v = make(rng, L, L, 8, 2, D)
            (q8, cq), (k8, ck), (v8, cv) = (quantize(x) for x in (q, k, v))
            dq, dk, dv = (np.float32(s) * x.astype(np.float32)
                          for x, s in ((q8, cq), (k8, ck), (v8, cv)))
            desc = dict(q_descale=cq, k_descale=ck, v_descale=cv)
            exact, _ = reference_attention(q, k, v)
            exact_deq, _ = reference_attention(dq, dk, dv)
            fp8 = fp.dense_attention(q8, k8, v8, **desc).astype(np.float32)
            kv = fp.dense_attention(q.astype(BF16), k8, v8, k_descale=ck,
                                    v_descale=cv).astype(np.float32)
            bf16 = fp.dense_attention(*(x.astype(BF16) for x in (q, k, v))).astype(np.float32)
            sparse = []
            for inputs, kw in (((q8, k8, v8), desc), ([x.astype(BF16) for x in (q, k, v)], {})):
                for corr in (True, False):
                    out, stats = fp.prefill(*inputs, sink_tokens=64, window_tokens=128,
                                            mean_correction=corr, return_stats=True, **kw)
                    sparse.append(rel_l2(out.astype(np.float32), exact))
                sparse.append(100 * stats["density"])
            scale = 1 / np.sqrt(D)
            reading = {(fm, rs): eq15_variant(q8, k8, v8, (cq, ck, cv), scale, fm, rs)
                       for fm, rs in ((True, True), (False, False), (False, True), (False, "fp16"))}
            variants = [rel_l2(reading[True, True], fp8), rel_l2(reading[False, False], fp8),
                        rel_l2(reading[False, "fp16"], reading[False, True])]
            print(f"| {kind} | {D} | {rel_l2(fp8, exact_deq):.2e} | {rel_l2(fp8, exact):.2e} | "
                  f"{rel_l2(kv, exact):.2e} | {rel_l2(bf16, exact):.2e} | {sparse[0]:.2e} / "
                  f"{sparse[1]:.2e} ({sparse[2]:.0f} %) | {sparse[3]:.2e} / {sparse[4]:.2e} "
                  f"({sparse[5]:.0f} %) | {variants[0]:.2e} | {variants[1]:.2e} | "
                  f"{variants[2]:.2e} |", flush=True)


if __name__ == "__main__":
    main()
