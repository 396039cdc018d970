"""FP8 e4m3 (Eq. 15, docs/ALGORITHM.md "FP8 e4m3"): the library's rounding against ml_dtypes'
float8_e4m3fn, an independent numpy model of Eq. 15, float64 attention on the dequantized
inputs, and the error classes."""

import ctypes
import re

import numpy as np
import pytest

import flashprefill as fp
from flashprefill import _lib
from flashprefill._problem import build_problem

from conftest import cu_of, random_qkv, reference_attention, rel_l2, structured_qkv

ml_dtypes = pytest.importorskip("ml_dtypes")
E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
LOG2E = np.float32(1.4426950408889634)


def quantize(x, descale):
    """round_e4m3(x * (1 / c)) with saturation, as the library and FP8 quantizers round."""
    inv = np.float32(1) / np.float32(descale)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and infinite inputs
        return np.clip(x.astype(np.float32) * inv, -448, 448).astype(E4M3)


def every_value(dtype):
    """Every bit pattern of a 16-bit dtype as that dtype (NaNs and infinities included)."""
    return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype)


def observed_q(q, q_descale):
    """The e4m3 q~ the library uses, observed through the LSE of one key k = 1 per request with
    D = 1 and scale 1: lse = c_q q~."""
    n = q.shape[0]
    k = np.ones((n, 1, 1), dtype=E4M3)
    cu = np.arange(n + 1, dtype=np.int32)
    _, lse = fp.dense_attention(q.reshape(n, 1, 1), k, k, softmax_scale=1.0, cu_seqlens_q=cu,
                                cu_seqlens_k=cu, return_lse=True, q_descale=q_descale)
    return lse[0] / np.float32(q_descale)


@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("descale", [1.0, 0.37], ids=["c1", "c0.37"])
def test_q_quantization_matches_ml_dtypes(dtype, descale):
    x = every_value(dtype)
    want = quantize(x, descale).astype(np.float32)
    got = observed_q(x, descale)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    # lse comes back through log2 units: equal to the e4m3 value to float32 rounding (the 2^8
    # offset, 8 - 8 in log2 units, leaves an absolute error near ulp(8)).
    assert np.allclose(got[~nan], want[~nan], rtol=1e-6, atol=1e-6)
    assert np.array_equal(got[~nan].astype(E4M3), want[~nan].astype(E4M3))
    # Round to nearest even at the midpoints, and saturation (ml_dtypes itself gives NaN past
    # 464; FP8 kernels and quantizers saturate).
    assert observed_q(np.array([1.0625, 1.1875, 464, 1e4, -np.inf], dtype=dtype),
                      1.0).tolist() == pytest.approx([1.0, 1.25, 448, 448, -448], rel=1e-6)


def stage_ranges(pos):
    """Key ranges of the unsplit operator's stages for a row at `pos` in dense mode: the aligned
    128-key groups from the highest down (keys past pos are masked)."""
    return [(c * 128, min(c * 128 + 128, pos + 1)) for c in range(pos // 128, -1, -1)]


def eq15(q8, k8, v8, cq, ck, cv, scale):
    """Eq. 15 written independently: one request, per-tensor descales, float64 except that every
    P~ is rounded to e4m3 by ml_dtypes; (out, lse)."""
    q, k, v = (np.asarray(x, dtype=np.float32).astype(np.float64) for x in (q8, k8, v8))
    len_q, heads_q, _ = q.shape
    len_kv, heads_kv, _ = k.shape
    g = heads_q // heads_kv
    s_log2 = scale * cq * ck / np.log(2)
    out = np.zeros(q.shape)
    lse = np.zeros((heads_q, len_q))
    for h in range(heads_q):
        for i in range(len_q):
            pos = len_kv - len_q + i
            m, l, acc = -np.inf, 0.0, np.zeros(q.shape[2])
            for a, b in stage_ranges(pos):
                s = k[a:b, h // g] @ q[i, h] * s_log2
                m_new = max(m, s.max())
                p = np.exp2(s - m_new + 8).astype(np.float32).astype(E4M3).astype(np.float64)
                rescale = np.exp2(m - m_new)
                l = l * rescale + p.sum()
                acc = acc * rescale + p @ v[a:b, h // g]
                m = m_new
            out[i, h] = cv * acc / l
            lse[h, i] = (m + np.log2(l) - 8) * np.log(2)
    return out, lse


def per_tensor(x):
    return float(np.abs(x).max()) / 448


def test_dense_matches_independent_eq15(rng):
    q, k, v = random_qkv(rng, 150, 300, 4, 2, 32)
    c = [per_tensor(x) for x in (q, k, v)]
    q8, k8, v8 = (quantize(x, s) for x, s in zip((q, k, v), c))
    out, lse = fp.dense_attention(q8, k8, v8, return_lse=True, q_descale=c[0], k_descale=c[1],
                                  v_descale=c[2])
    assert out.dtype == BF16
    want, want_lse = eq15(q8, k8, v8, *c, 1 / np.sqrt(32))
    # Only float32-vs-float64 arithmetic differs (now and then a P~ near a rounding midpoint
    # rounds the other way: one e4m3 step of one weight), and the bfloat16 output rounding.
    assert rel_l2(out.astype(np.float32), want) < 3e-3
    assert np.abs(lse - want_lse).max() < 1e-3


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_dense_matches_float64_on_the_dequantized_inputs(rng, per_head):
    lengths_q, lengths_k = [200, 77], [260, 300]
    cu_q, cu_k = cu_of(lengths_q), cu_of(lengths_k)
    q, k, v = structured_qkv(rng, sum(lengths_q), sum(lengths_k), 8, 2, 64)
    group = 4
    if per_head:
        def descale(x, cu, heads_per_kv):
            return np.array([[np.abs(x[cu[b]:cu[b + 1], h * heads_per_kv:(h + 1) * heads_per_kv])
                              .max() / 448 for h in range(2)] for b in range(2)], np.float32)
        c = [descale(q, cu_q, group), descale(k, cu_k, 1), descale(v, cu_k, 1)]
    else:
        c = [np.float32(per_tensor(x)) for x in (q, k, v)]

    def scales(x, s, cu, heads_per_kv):
        if not per_head:
            return np.full(x.shape[:2] + (1,), s, np.float32)
        request = np.searchsorted(cu, np.arange(x.shape[0]), side="right") - 1
        return s[request][:, np.arange(x.shape[1]) // heads_per_kv][..., None]

    sq, sk, sv = scales(q, c[0], cu_q, group), scales(k, c[1], cu_k, 1), scales(v, c[2], cu_k, 1)
    q8, k8, v8 = (np.clip(x * (np.float32(1) / s), -448, 448).astype(E4M3)
                  for x, s in ((q, sq), (k, sk), (v, sv)))
    dq, dk, dv = (s * x.astype(np.float32) for x, s in ((q8, sq), (k8, sk), (v8, sv)))
    out = fp.dense_attention(q8, k8, v8, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, q_descale=c[0],
                             k_descale=c[1], v_descale=c[2]).astype(np.float32)
    exact_deq, _ = reference_attention(dq, dk, dv, cu_q, cu_k)
    exact, _ = reference_attention(q, k, v, cu_q, cu_k)
    bf16 = fp.dense_attention(*(x.astype(BF16) for x in (q, k, v)), cu_seqlens_q=cu_q,
                              cu_seqlens_k=cu_k).astype(np.float32)
    assert rel_l2(out, exact_deq) < 3e-2
    assert rel_l2(out, exact) < 8e-2
    assert rel_l2(bf16, exact) < rel_l2(out, exact)
    # bfloat16 q over the e4m3 KV cache, q quantized by the library (dynamic c_q per request
    # and KV head), against the same with those c_q given.
    kv = fp.dense_attention(q.astype(BF16), k8, v8, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                            k_descale=c[1], v_descale=c[2])
    assert kv.dtype == BF16
    assert rel_l2(kv.astype(np.float32), exact) < 8e-2


def test_dynamic_q_descale_is_max_over_the_request_and_group(rng):
    q, k, v = random_qkv(rng, 90, 90, 4, 2, 16)
    cu = [0, 40, 90]
    q16, k8, v8 = q.astype(np.float16), k.astype(E4M3), v.astype(E4M3)
    amax = np.array([[np.abs(q16[cu[b]:cu[b + 1], 2 * h:2 * h + 2].astype(np.float32)).max()
                      for h in range(2)] for b in range(2)], np.float32)
    dynamic = fp.dense_attention(q16, k8, v8, cu_seqlens_q=cu, cu_seqlens_k=cu)
    given = fp.dense_attention(q16, k8, v8, cu_seqlens_q=cu, cu_seqlens_k=cu,
                               q_descale=amax / np.float32(448))
    assert dynamic.dtype == np.float16
    assert np.array_equal(dynamic, given)
    fixed = fp.dense_attention(q16, k8, v8, cu_seqlens_q=cu, cu_seqlens_k=cu, q_descale=0.5)
    assert not np.array_equal(dynamic, fixed)


def test_alpha_zero_prefill_equals_fp8_dense(rng):
    q, k, v = structured_qkv(rng, 300, 420, 8, 2, 64)
    q8, k8, v8 = (x.astype(E4M3) for x in (q, k, v))
    dense = fp.dense_attention(q8, k8, v8, k_descale=0.5, v_descale=2.0)
    for correction in (False, True):
        got = fp.prefill(q8, k8, v8, alpha=0.0, sink_tokens=0, window_tokens=0,
                         dense_recent_tiles=0, mean_correction=correction, k_descale=0.5,
                         v_descale=2.0)
        assert np.array_equal(got, dense)


def test_paged_cache_equals_contiguous(rng):
    lengths_q, lengths_k, page_size = [100, 37], [300, 37], 16
    q, k, v = structured_qkv(rng, sum(lengths_q), sum(lengths_k), 4, 2, 64)
    cu_q, cu_k = cu_of(lengths_q), cu_of(lengths_k)
    q16, k8, v8 = q.astype(np.float16), k.astype(E4M3), v.astype(E4M3)
    pages = [-(-n // page_size) for n in lengths_k]
    order = rng.permutation(sum(pages))
    k_cache = np.zeros((sum(pages), page_size, 2, 64), E4M3)
    v_cache = np.zeros_like(k_cache)
    table = np.zeros((2, max(pages)), np.int32)
    for b, n in enumerate(lengths_k):
        for i in range(pages[b]):
            page = order[sum(pages[:b]) + i]
            table[b, i] = page
            rows = slice(cu_k[b] + i * page_size, cu_k[b] + min((i + 1) * page_size, n))
            count = rows.stop - rows.start
            k_cache[page, :count], v_cache[page, :count] = k8[rows], v8[rows]
    kw = dict(cu_seqlens_q=cu_q, k_descale=0.25, v_descale=np.array([[1.0, 2.0], [0.5, 1.0]],
                                                                     np.float32))
    paged = fp.PagedKV(k_cache, v_cache, table, lengths_k)
    for call in (fp.dense_attention, fp.prefill):
        assert np.array_equal(call(q16, paged, **kw), call(q16, k8, v8, cu_seqlens_k=cu_k, **kw))


def test_fp16_output_and_sparse_stages(rng):
    q, k, v = structured_qkv(rng, 256, 1024, 4, 1, 64)
    q8, k8, v8 = (x.astype(E4M3) for x in (q, k, v))
    index = fp.build_index(q8, k8, v8, fp.SelectConfig(alpha=0.3, sink_tokens=64,
                                                       window_tokens=64))
    assert 0 < index.density() < 1
    out = np.empty(q.shape, np.float16)
    got = fp.sparse_attention(q8, k8, v8, index, out=out)
    assert got is out
    exact, _ = reference_attention(*(x.astype(np.float32) for x in (q8, k8, v8)))
    assert rel_l2(out, exact) < 5e-2


def test_errors(rng):
    q, k, v = random_qkv(rng, 64, 64, 2, 1, 16)
    q8, k8, v8 = (x.astype(E4M3) for x in (q, k, v))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(fp.FlashPrefillError, match="must be finite and > 0") as e:
            fp.dense_attention(q8, k8, v8, k_descale=bad)
        assert e.value.status == fp.Status.INVALID_ARGUMENT
    with pytest.raises(ValueError, match=r"\[B, Hkv\]"):
        fp.dense_attention(q8, k8, v8, v_descale=np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="float32"):
        fp.dense_attention(q8, k8, v8, v_descale=np.ones((1,), np.float64))
    with pytest.raises(TypeError, match="differs from q"):
        fp.dense_attention(q8, k.astype(BF16), v.astype(BF16))
    with pytest.raises(TypeError, match="k and v share one dtype"):
        fp.dense_attention(q.astype(BF16), k8, v.astype(BF16))
    with pytest.raises(fp.FlashPrefillError, match="mixed dtypes"):
        fp.dense_attention(q, k8, v8)
    with pytest.raises(fp.FlashPrefillError, match="no tensor is e4m3"):
        fp.dense_attention(q, k, v, k_descale=1.0)
    with pytest.raises(ValueError, match="writes bfloat16 or float16"):
        fp.dense_attention(q8, k8, v8, out=np.empty(q.shape, np.float32))
    with pytest.raises(TypeError, match="float64 is not supported; an FP8 problem writes"):
        fp.dense_attention(q8, k8, v8, out=np.empty(q.shape, np.float64))
    with pytest.raises(TypeError, match="kv_dtype: dtype float8_e5m2 is not supported"):
        fp.Plan(2, 1, 16, np.dtype(BF16), None, [0, 8], 8, 8, cu_seqlens_k=[0, 8],
                kv_dtype=ml_dtypes.float8_e5m2)


def test_descale_factors_outside_float32s_normal_range(rng):
    """A factor whose reciprocal overflows float32 (so that the quantized zeros of a bf16 q
    would turn NaN) is refused by the library; a Python number that float32 cannot hold is
    refused by its own value; a bool is not a factor."""
    q, k, v = random_qkv(rng, 64, 64, 2, 1, 16)
    q8, k8, v8 = (x.astype(E4M3) for x in (q, k, v))
    q16 = q.astype(BF16)
    q16[:, :, 0] = 0
    with pytest.raises(fp.FlashPrefillError, match=r"q_descale\[request 0, kv head 0\] = "
                       r"1.4013e-45 is below the smallest normal float32") as e:
        fp.dense_attention(q16, k8, v8, q_descale=np.array([1e-45], np.float32))
    assert e.value.status == fp.Status.INVALID_ARGUMENT
    tiny = np.finfo(np.float32).tiny
    out = fp.dense_attention(q16, k8, v8, q_descale=np.array([tiny], np.float32))
    assert np.isfinite(out.astype(np.float32)).all()
    for bad in (1e-50, 1e-40, 1e39, -1e39):
        with pytest.raises(ValueError, match=re.escape(f"k_descale = {bad!r}: outside the normal "
                                                       f"float32 range")):
            fp.dense_attention(q8, k8, v8, k_descale=bad)
    with pytest.raises(TypeError, match="got the bool True"):
        fp.dense_attention(q8, k8, v8, k_descale=True)


def test_a_refused_descale_leaves_the_plan_as_it_was(rng):
    """Plan.run checks all three descales before it sets any: after a refused argument the
    next run is the plain one."""
    q, k, v = (x.astype(BF16) for x in random_qkv(rng, 64, 64, 2, 1, 16))
    plan = fp.Plan(2, 1, 16, np.dtype(BF16), None, [0, 64], 64, 64, cu_seqlens_k=[0, 64],
                   dense=True)
    want = plan.run(q, k, v)
    with pytest.raises(ValueError, match="k_descale: expected shape"):
        plan.run(q, k, v, q_descale=1.0, k_descale=np.ones((3, 3), np.float32))
    assert np.array_equal(plan.run(q, k, v), want)


def test_plan_refuses_fp8():
    with pytest.raises(TypeError, match="Plan takes"):
        fp.Plan(2, 1, 16, np.dtype(E4M3), None, [0, 8], 8, 8, cu_seqlens_k=[0, 8])
    with pytest.raises(TypeError, match="kv_dtype: float16 differs from dtype"):
        fp.Plan(2, 1, 16, np.dtype(BF16), None, [0, 8], 8, 8, cu_seqlens_k=[0, 8],
                kv_dtype=np.float16)


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
def test_plan_over_an_fp8_kv_cache_equals_the_functional_calls(rng, dense):
    """A Plan with kv_dtype e4m3 (bfloat16 q over a paged e4m3 cache): every run, with the
    layer's own descales, equals the functional call bit for bit; kept means too; a plan that
    was handed descales for a problem without e4m3 tensors refuses them and forgets them."""
    lengths_q, lengths_k, page_size = [300, 37], [700, 37], 16
    cu_q, cu_k = cu_of(lengths_q), cu_of(lengths_k)
    select = dict(alpha=0.3, sink_tokens=64, window_tokens=128)
    config = fp.SelectConfig(**select)
    plan = None
    for _ in range(2):  # two layers, each with its own cache and descales
        q, k, v = structured_qkv(rng, sum(lengths_q), sum(lengths_k), 4, 2, 64)
        c_k, c_v = per_tensor(k), np.array([[0.5, 1.0], [2.0, 0.25]], np.float32) * per_tensor(v)
        k8 = quantize(k, c_k)
        v8 = np.concatenate([quantize(v[cu_k[b]:cu_k[b + 1]], c_v[b][None, :, None])
                             for b in range(2)])
        # One page order for every layer: the plan holds the forward's page table.
        k_cache, v_cache, table = paged_cache(k8, v8, cu_k, page_size, np.random.default_rng(7))
        if plan is None:
            plan = fp.Plan(4, 2, 64, np.dtype(BF16), None, cu_q, 300, 700,
                           seqlens_k=lengths_k, page_table=table, config=config, dense=dense,
                           kv_dtype=E4M3)
        q16 = q.astype(BF16)
        descales = dict(k_descale=c_k, v_descale=c_v)
        call = fp.dense_attention if dense else fp.prefill
        kw = {} if dense else select
        want = call(q16, k8, v8, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **descales, **kw)
        got = plan.run(q16, k_cache, v_cache, **descales)
        assert got.dtype == BF16 and np.array_equal(got, want)
        given_q = plan.run(q16, k_cache, v_cache, q_descale=0.05, **descales)
        assert np.array_equal(given_q, call(q16, k8, v8, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                            q_descale=0.05, **descales, **kw))
        assert not np.array_equal(given_q, want)
        if not dense:
            shape = plan.means_shape
            means = (np.zeros(shape, np.float32), np.zeros(shape, np.float32))
            kept = plan.run(q16, k_cache, v_cache, means=means, **descales)
            assert np.array_equal(kept, want)
            again = plan.run(q16, k_cache, v_cache, means=means,
                             pooled_keys=np.array(lengths_k, np.int32), **descales)
            assert np.array_equal(again, want)
    with pytest.raises(TypeError, match="k: dtype bfloat16 differs from the plan's"):
        plan.run(q16, k_cache.astype(BF16), v_cache, **descales)
    plain = fp.Plan(4, 2, 64, np.dtype(BF16), None, cu_q, 300, 700, seqlens_k=lengths_k,
                    page_table=table, config=config, dense=dense)
    k16, v16 = k_cache.astype(BF16), v_cache.astype(BF16)
    with pytest.raises(fp.FlashPrefillError, match="k_descale is set but no tensor is e4m3"):
        plain.run(q16, k16, v16, k_descale=1.0)
    assert np.array_equal(plain.run(q16, k16, v16), call(
        q16, fp.PagedKV(k16, v16, table, lengths_k), cu_seqlens_q=cu_q, **kw))


def paged_cache(k, v, cu_k, page_size, rng):
    """k, v rows of each request in shuffled pages of [num_pages, page_size, Hkv, D] caches."""
    lengths = np.diff(cu_k)
    pages = [-(-int(n) // page_size) for n in lengths]
    order = rng.permutation(sum(pages) + 2)
    k_cache = np.zeros((sum(pages) + 2, page_size) + k.shape[1:], k.dtype)
    v_cache = np.zeros_like(k_cache)
    table = np.zeros((len(lengths), max(pages)), np.int32)
    used = 0
    for b, n in enumerate(lengths):
        for j in range(pages[b]):
            table[b, j] = page = order[used]
            used += 1
            rows = slice(cu_k[b] + j * page_size, cu_k[b] + min(int(n), (j + 1) * page_size))
            k_cache[page, :rows.stop - rows.start] = k[rows]
            v_cache[page, :rows.stop - rows.start] = v[rows]
    return k_cache, v_cache, table


def _cuda_problem(q, k, v):
    """The problem of host arrays with its device set to CUDA: the C ABI validates it without
    reading any pointer."""
    problem = build_problem(q, k, v)
    problem.c.device = _lib.Device.CUDA
    return problem


def test_cuda_takes_every_fp8_problem(rng):
    """On CUDA the attention calls and fp_prefill take e4m3 q, k and v and a bfloat16 q over an
    e4m3 KV cache alike: both get past the FP8 checks to the device's on every build, and a
    stride the e4m3 kernels cannot read is refused by name."""
    q, k, v = random_qkv(rng, 64, 64, 2, 1, 64)
    k8, v8 = k.astype(E4M3), v.astype(E4M3)
    nbytes = ctypes.c_size_t()
    config = fp.SelectConfig().to_c()
    for problem in (_cuda_problem(q.astype(BF16), k8, v8), _cuda_problem(q.astype(E4M3), k8, v8)):
        if fp.cuda_available():
            continue  # the sizes below are the device's to give
        with pytest.raises(fp.FlashPrefillError, match="no CUDA backend") as e:
            _lib.call("fp_dense_attention_workspace_size", ctypes.byref(problem.c),
                      ctypes.byref(nbytes))
        assert e.value.status == fp.Status.UNSUPPORTED
        with pytest.raises(fp.FlashPrefillError, match="no CUDA backend") as e:
            _lib.call("fp_prefill_workspace_size", ctypes.byref(problem.c), ctypes.byref(config),
                      ctypes.byref(nbytes))
        assert e.value.status == fp.Status.UNSUPPORTED
    narrow = _cuda_problem(q.astype(E4M3), k8, v8)
    narrow.c.k_stride_token = 72  # whole 16-byte chunks of e4m3 only
    with pytest.raises(fp.FlashPrefillError, match="k strides must be multiples of 16") as e:
        _lib.call("fp_prefill_workspace_size", ctypes.byref(narrow.c), ctypes.byref(config),
                  ctypes.byref(nbytes))
    assert e.value.status == fp.Status.UNSUPPORTED


@pytest.mark.parametrize("validate", [True, False], ids=["validated", "unvalidated"])
def test_cuda_e4m3_attention_equals_the_cpu_reference(rng, validate):
    """e4m3 dense and sparse attention on CUDA (torch.float8_e4m3fn, descales per (request, KV
    head) in device memory, different for every head) against the CPU FP8 reference on the same
    codes, descales and index: only float32 arithmetic differs (docs/ALGORITHM.md: 2e-2)."""
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and fp.cuda_available()):
        pytest.skip("needs the library's CUDA path and a GPU")
    lengths_q, lengths_k = [200, 77], [260, 700]
    cu_q, cu_k = cu_of(lengths_q), cu_of(lengths_k)
    q, k, v = structured_qkv(rng, sum(lengths_q), sum(lengths_k), 8, 2, 128)
    q8, k8, v8 = (quantize(x, per_tensor(x)) for x in (q, k, v))
    c = [(rng.uniform(0.5, 2.0, (2, 2)) * per_tensor(x)).astype(np.float32) for x in (q, k, v)]
    config = fp.SelectConfig(alpha=0.3, sink_tokens=64, window_tokens=64, mean_correction=False)
    cpu_index = fp.build_index(q8, k8, v8, config, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               q_descale=c[0], k_descale=c[1], v_descale=c[2])
    cpu_args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, q_descale=c[0], k_descale=c[1],
                    v_descale=c[2])
    want_dense = fp.dense_attention(q8, k8, v8, **cpu_args).astype(np.float32)
    want_sparse = fp.sparse_attention(q8, k8, v8, cpu_index, **cpu_args).astype(np.float32)

    def cuda(x):
        if x.dtype == E4M3:
            return torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
        return torch.from_numpy(x).cuda()

    index = fp.Index(cuda(cpu_index.cu), cuda(cpu_index.idx), cuda(cpu_index.k_mean),
                     config=config)
    args = dict(cu_seqlens_q=cuda(cu_q), cu_seqlens_k=cuda(cu_k), q_descale=cuda(c[0]),
                k_descale=cuda(c[1]), v_descale=cuda(c[2]), validate_metadata=validate,
                max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    tensors = [cuda(x) for x in (q8, k8, v8)]
    dense = fp.dense_attention(*tensors, **args)
    sparse = fp.sparse_attention(*tensors, index, **args)
    assert dense.dtype == torch.bfloat16 and dense.device.type == "cuda"
    assert rel_l2(dense.float().cpu().numpy(), want_dense) < 2e-2
    assert rel_l2(sparse.float().cpu().numpy(), want_sparse) < 2e-2
    assert rel_l2(want_sparse, want_dense) > 1e-2  # the index drops blocks that matter
    # A bfloat16 q over the e4m3 cache (quantized on the device, c_q per (request, KV head)
    # computed there as the CPU computes it), and the whole prefill of both problems.
    q16 = q.astype(BF16)
    kv_args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, k_descale=c[1], v_descale=c[2])
    cuda_kv_args = {n: a for n, a in args.items() if n != "q_descale"}
    want_kv = fp.dense_attention(q16, k8, v8, **kv_args).astype(np.float32)
    got_kv = fp.dense_attention(cuda(q16.view(np.uint16)).view(torch.bfloat16), *tensors[1:],
                                **cuda_kv_args)
    assert rel_l2(got_kv.float().cpu().numpy(), want_kv) < 2e-2
    got_prefill = fp.prefill(*tensors, alpha=0.0, **args)  # alpha 0: every block
    assert rel_l2(got_prefill.float().cpu().numpy(), want_dense) < 2e-2


def test_torch_float8(rng):
    torch = pytest.importorskip("torch")
    q, k, v = random_qkv(rng, 100, 100, 2, 1, 32)
    want = fp.dense_attention(*(x.astype(E4M3) for x in (q, k, v)), k_descale=0.5)
    got = fp.dense_attention(*(torch.from_numpy(x).to(torch.float8_e4m3fn) for x in (q, k, v)),
                             k_descale=torch.tensor([0.5]))
    assert got.dtype == torch.bfloat16
    assert np.array_equal(got.float().numpy(), want.astype(np.float32))
