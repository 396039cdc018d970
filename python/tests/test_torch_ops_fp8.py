"""torch.ops.flashprefill.* on FP8 e4m3 operands (docs/ALGORITHM.md "FP8 e4m3"): e4m3 q, k and v,
and a bfloat16 q over an e4m3 KV cache, with descale tensors. Each op against the functional API
on numpy arrays (the library's non-torch path) bit for bit, against float64 attention on the
dequantized inputs within the documented bound, under torch.compile(fullgraph=True), and the
errors of bad descales."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, reference_attention, rel_l2, structured_qkv

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
import flashprefill.torch  # noqa: E402,F401 - registers the ops; needs torch

ops = torch.ops.flashprefill
E4M3 = torch.float8_e4m3fn
SELECT = dict(alpha=0.3, sink_tokens=64, window_tokens=128)
LENS_Q, LENS_K, HEADS, DIM = (300, 200), (300, 700), (4, 2), 32
GROUP = HEADS[0] // HEADS[1]
# docs/ALGORITHM.md "FP8 e4m3", Tolerances: the CPU FP8 reference against float64 attention on
# its dequantized inputs, relative L2; its LSE against the same, absolute (log(1 + 2^-4)).
DEQUANTIZED_TOLERANCE = 3e-2
LSE_TOLERANCE = 6.1e-2


def quantize(x, descale):
    """round_e4m3(x * (1 / c)), saturating (as the library and FP8 quantizers round); descale
    broadcasts against x."""
    return (x * (1 / descale)).clamp(-448, 448).to(E4M3)


def per_group(x, cu, heads_per_kv):
    """[B, Hkv] float32: max |x| / 448 over each request's rows and KV head's group of heads."""
    return torch.tensor([[float(x[cu[b]:cu[b + 1], h * heads_per_kv:(h + 1) * heads_per_kv]
                                .abs().max()) / 448 for h in range(HEADS[1])]
                         for b in range(len(cu) - 1)], dtype=torch.float32)


def expand(descale, x, cu, heads_per_kv):
    """[B, Hkv] factors as one per element of x [rows, H, D] (rows in requests by cu)."""
    request = torch.from_numpy(np.searchsorted(cu, np.arange(x.shape[0]), side="right") - 1)
    return descale[request][:, torch.arange(x.shape[1]) // heads_per_kv][..., None]


class Case:
    """One FP8 problem: e4m3 k and v with [B, Hkv] descales, and either e4m3 q with its
    descales ("e4m3") or a bfloat16 q that the library quantizes itself ("kv_cache")."""

    def __init__(self, rng, kind):
        q, k, v = (torch.from_numpy(a) for a in
                   structured_qkv(rng, sum(LENS_Q), sum(LENS_K), *HEADS, DIM))
        cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
        self.kind = kind
        self.k_descale, self.v_descale = per_group(k, cu_k, 1), per_group(v, cu_k, 1)
        self.k = quantize(k, expand(self.k_descale, k, cu_k, 1))
        self.v = quantize(v, expand(self.v_descale, v, cu_k, 1))
        self.dk = expand(self.k_descale, k, cu_k, 1) * self.k.float()
        self.dv = expand(self.v_descale, v, cu_k, 1) * self.v.float()
        if kind == "e4m3":
            self.q_descale = per_group(q, cu_q, GROUP)
            self.q = quantize(q, expand(self.q_descale, q, cu_q, GROUP))
            self.dq = expand(self.q_descale, q, cu_q, GROUP) * self.q.float()
        else:
            self.q_descale = None
            self.q = q.to(torch.bfloat16)
            # The library's q~: the dynamic c_q of each request and KV head, applied as above.
            c_q = per_group(self.q.float(), cu_q, GROUP)
            self.dq = expand(c_q, q, cu_q, GROUP) * quantize(
                self.q.float(), expand(c_q, q, cu_q, GROUP)).float()
        self.meta = dict(cu_seqlens_q=torch.from_numpy(cu_q), cu_seqlens_k=torch.from_numpy(cu_k),
                         max_seqlen_q=max(LENS_Q), max_seqlen_k=max(LENS_K))
        self.descales = dict(q_descale=self.q_descale, k_descale=self.k_descale,
                             v_descale=self.v_descale)

    def numpy(self):
        """q, k, v as numpy arrays (ml_dtypes), with the numpy metadata and descales."""
        def host(t):
            if t.dtype == E4M3:
                return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)

        kw = dict(cu_seqlens_q=self.meta["cu_seqlens_q"].numpy(),
                  cu_seqlens_k=self.meta["cu_seqlens_k"].numpy(),
                  **{name: None if d is None else d.numpy() for name, d in self.descales.items()})
        return (host(self.q), host(self.k), host(self.v)), kw


def as_float(x):
    return x.float().numpy() if isinstance(x, torch.Tensor) else x.astype(np.float32)


@pytest.mark.parametrize("kind", ["e4m3", "kv_cache"])
def test_fp8_ops_match_the_functional_api(rng, kind):
    c = Case(rng, kind)
    (q, k, v), kw = c.numpy()
    args, meta = (c.q, c.k, c.v), dict(c.meta, **c.descales)
    want, want_lse = fp.prefill(q, k, v, **SELECT, **kw, return_lse=True)
    got = ops.prefill(*args, **meta, **SELECT)
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(as_float(got), as_float(want))
    out = torch.full(c.q.shape, float("nan"), dtype=torch.bfloat16)
    lse = torch.full((HEADS[0], c.q.shape[0]), float("nan"))
    ops.prefill_out(*args, out, lse, **meta, **SELECT)
    np.testing.assert_array_equal(as_float(out), as_float(want))
    np.testing.assert_array_equal(lse.numpy(), want_lse)
    # An out in float16 chooses the output dtype, as in the functional API.
    half = torch.empty(c.q.shape, dtype=torch.float16)
    ops.prefill_out(*args, half, **meta, **SELECT)
    np.testing.assert_array_equal(half.numpy(), fp.prefill(
        q, k, v, **SELECT, **kw, out=np.empty(q.shape, np.float16)))

    dense, dense_lse = fp.dense_attention(q, k, v, **kw, return_lse=True)
    np.testing.assert_array_equal(as_float(ops.dense_attention(*args, **meta)), as_float(dense))
    ops.dense_attention_out(*args, out, lse, **meta)
    np.testing.assert_array_equal(as_float(out), as_float(dense))
    np.testing.assert_array_equal(lse.numpy(), dense_lse)

    index = fp.build_index(q, k, v, fp.SelectConfig(**SELECT), **kw)
    cu, idx, k_mean, v_mean = ops.build_index(*args, **meta, **SELECT)
    np.testing.assert_array_equal(cu.numpy(), index.cu)
    used = int(cu[-1])
    np.testing.assert_array_equal(idx[:used].numpy(), index.idx[:used])
    for b, blocks in enumerate(-(-n // 128) for n in LENS_K):  # later blocks: unspecified
        np.testing.assert_array_equal(k_mean[b, :, :blocks].numpy(), index.k_mean[b, :, :blocks])
        np.testing.assert_array_equal(v_mean[b, :, :blocks].numpy(), index.v_mean[b, :, :blocks])
    assert 0 < index.density() < 1
    sparse = ops.sparse_attention(*args, cu, idx, k_mean, v_mean, **meta)
    np.testing.assert_array_equal(as_float(sparse), as_float(
        fp.sparse_attention(q, k, v, index, **kw)))
    assert sparse.equal(got)  # the two stages are the prefill
    ops.sparse_attention_out(*args, cu, idx, k_mean, v_mean, out, lse, **meta)
    assert out.equal(got) and lse.equal(torch.from_numpy(want_lse))

    # pool_kv pools the dequantized keys as the index stage does; build_index_out then scores
    # on those means alone.
    pooled_k, pooled_v = torch.zeros_like(k_mean), torch.zeros_like(v_mean)
    ops.pool_kv(*args, pooled_k, pooled_v, **c.meta, k_descale=c.k_descale,
                v_descale=c.v_descale)
    assert pooled_k.equal(k_mean) and pooled_v.equal(v_mean)
    cu2, idx2 = torch.empty_like(cu), torch.empty_like(idx)
    ops.build_index_out(*args, cu2, idx2, pooled_k, pooled_v, **meta, **SELECT,
                        means_pooled=True)
    assert cu2.equal(cu) and idx2[:used].equal(idx[:used])


@pytest.mark.parametrize("kind", ["e4m3", "kv_cache"])
def test_fp8_ops_near_float64_on_the_dequantized_inputs(rng, kind):
    c = Case(rng, kind)
    cu_q, cu_k = cu_of(LENS_Q), cu_of(LENS_K)
    exact, exact_lse = reference_attention(c.dq.numpy(), c.dk.numpy(), c.dv.numpy(), cu_q, cu_k)
    out = torch.empty(c.q.shape, dtype=torch.bfloat16)
    lse = torch.empty(HEADS[0], c.q.shape[0])
    ops.dense_attention_out(c.q, c.k, c.v, out, lse, **c.meta, **c.descales)
    assert rel_l2(as_float(out), exact) <= DEQUANTIZED_TOLERANCE
    assert np.abs(lse.numpy() - exact_lse).max() <= LSE_TOLERANCE
    # alpha = 0 selects every block: FP8 dense attention exactly (docs/ALGORITHM.md).
    dense_prefill = ops.prefill(c.q, c.k, c.v, **c.meta, **c.descales, alpha=0.0)
    assert dense_prefill.equal(out)


def test_fp8_paged_ops_equal_contiguous(rng):
    c = Case(rng, "kv_cache")
    page_size, lens = 16, list(LENS_K)
    pages = [-(-n // page_size) for n in lens]
    order = torch.from_numpy(rng.permutation(sum(pages) + 2)).tolist()
    k_cache = torch.zeros((sum(pages) + 2, page_size, HEADS[1], DIM), dtype=torch.uint8)
    v_cache = torch.zeros_like(k_cache)
    table = torch.zeros((2, max(pages)), dtype=torch.int32)
    cu_k = cu_of(lens)
    for b, n in enumerate(lens):
        for j in range(pages[b]):
            page = order.pop()
            table[b, j] = page
            rows = slice(int(cu_k[b]) + j * page_size, int(cu_k[b]) + min(n, (j + 1) * page_size))
            k_cache[page, :rows.stop - rows.start] = c.k[rows].view(torch.uint8)
            v_cache[page, :rows.stop - rows.start] = c.v[rows].view(torch.uint8)
    paged = dict(cu_seqlens_q=c.meta["cu_seqlens_q"], page_table=table,
                 seqlens_k=torch.tensor(lens, dtype=torch.int32), max_seqlen_q=max(LENS_Q),
                 max_seqlen_k=max(LENS_K), **c.descales)
    k8, v8 = k_cache.view(E4M3), v_cache.view(E4M3)
    want = ops.prefill(c.q, c.k, c.v, **c.meta, **c.descales, **SELECT)
    assert ops.prefill(c.q, k8, v8, **paged, **SELECT).equal(want)
    index = ops.build_index(c.q, k8, v8, **paged, **SELECT)
    assert ops.sparse_attention(c.q, k8, v8, *index, **paged).equal(want)
    assert ops.dense_attention(c.q, k8, v8, **paged).equal(
        ops.dense_attention(c.q, c.k, c.v, **c.meta, **c.descales))


def test_fp8_opcheck(rng):
    c = Case(rng, "e4m3")
    meta = dict(c.meta, **c.descales)
    out, lse = torch.empty(c.q.shape, dtype=torch.bfloat16), torch.empty(HEADS[0], c.q.shape[0])
    index = ops.build_index(c.q, c.k, c.v, **meta, **SELECT)
    for op, args, kwargs in [
            (ops.prefill, (c.q, c.k, c.v), dict(meta, **SELECT)),
            (ops.prefill_out, (c.q, c.k, c.v, out, lse), dict(meta, **SELECT)),
            (ops.dense_attention, (c.q, c.k, c.v), meta),
            (ops.build_index, (c.q, c.k, c.v), dict(meta, **SELECT)),
            (ops.pool_kv, (c.q, c.k, c.v, index[2].clone(), index[3].clone()),
             dict(c.meta, k_descale=c.k_descale, v_descale=c.v_descale)),
            (ops.sparse_attention, (c.q, c.k, c.v, *index), meta)]:
        # test_schema is left out: it perturbs the inputs with arithmetic that torch does not
        # implement for float8_e4m3fn on the CPU. The schemas' mutation annotations are the
        # ones test_torch_ops.py checks on the float32 calls.
        torch.library.opcheck(op, args, kwargs, test_utils=(
            "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("kind", ["e4m3", "kv_cache"])
def test_fp8_compile_fullgraph(rng, kind):
    c = Case(rng, kind)
    L_q, L_k = max(LENS_Q), max(LENS_K)

    def layer(q, k, v, cu_q, cu_k, q_descale, k_descale, v_descale):
        scales = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                      max_seqlen_q=L_q, max_seqlen_k=L_k)
        index = ops.build_index(q, k, v, cu_q, cu_k, **scales, **SELECT)
        sparse = ops.sparse_attention(q, k, v, *index, cu_q, cu_k, **scales)
        whole = ops.prefill(q, k, v, cu_q, cu_k, **scales, **SELECT)
        dense = ops.dense_attention(q, k, v, cu_q, cu_k, **scales)
        return sparse * 2.0, whole, dense.float()

    compiled = torch.compile(layer, fullgraph=True, backend="inductor")
    args = (c.q, c.k, c.v, c.meta["cu_seqlens_q"], c.meta["cu_seqlens_k"], c.q_descale,
            c.k_descale, c.v_descale)
    got, want = compiled(*args), layer(*args)
    assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16, torch.float32]
    for g, w in zip(got, want):
        assert g.equal(w)


def test_a_bad_lse_is_refused_before_any_work(rng):
    """The ops' functional paths (FP8, and sparse_attention_out on any dtype) check a caller's
    lse as Plan.run does, before anything is written: float32 [Hq, total_q], contiguous."""
    c = Case(rng, "e4m3")
    args, meta = (c.q, c.k, c.v), dict(c.meta, **c.descales)
    total_q = c.q.shape[0]
    index = ops.build_index(*args, **meta, **SELECT)
    bad = [(torch.zeros(HEADS[0], total_q, dtype=torch.float16), "expected dtype float32"),
           (torch.zeros(HEADS[0], total_q, dtype=torch.int32), "expected dtype float32"),
           (torch.zeros(3, HEADS[0], total_q), "expected shape"),
           (torch.zeros(HEADS[0], total_q + 1), "expected shape"),
           (torch.zeros(total_q, HEADS[0]).t(), "must be contiguous")]
    calls = [lambda out, lse: ops.dense_attention_out(*args, out, lse, **meta),
             lambda out, lse: ops.prefill_out(*args, out, lse, **meta, **SELECT),
             lambda out, lse: ops.sparse_attention_out(*args, *index, out, lse, **meta)]
    for call in calls:
        for lse, message in bad:
            out = torch.full(c.q.shape, float("nan"), dtype=torch.bfloat16)
            with pytest.raises(ValueError, match=f"lse: {message}"):
                call(out, lse)
            assert out.isnan().all()


def test_fp8_errors_reach_the_caller(rng):
    c = Case(rng, "e4m3")
    args = (c.q, c.k, c.v)
    with pytest.raises(ValueError, match=r"k_descale: expected shape \(\) or \(1,\).*\[B, Hkv\]"):
        ops.prefill(*args, **c.meta, k_descale=torch.ones(2, 3))
    with pytest.raises(TypeError, match="q_descale: expected float32"):
        ops.dense_attention(*args, **c.meta, q_descale=torch.ones(1, dtype=torch.float16))
    with pytest.raises(fp.FlashPrefillError, match="must be finite and > 0"):
        ops.dense_attention(*args, **c.meta, v_descale=torch.tensor(-1.0))
    plain = (c.dq, c.dk, c.dv)  # float32: no tensor is e4m3
    with pytest.raises(fp.FlashPrefillError, match="k_descale is set but no tensor is e4m3"):
        ops.prefill(*plain, **c.meta, k_descale=torch.tensor(1.0))
    with pytest.raises(fp.FlashPrefillError, match="no tensor is e4m3"):
        ops.pool_kv(*plain, torch.zeros(2, 2, 6, DIM), torch.zeros(2, 2, 6, DIM), **c.meta,
                    v_descale=torch.tensor(1.0))
    with pytest.raises(fp.FlashPrefillError, match="mixed dtypes"):
        ops.dense_attention(c.dq, c.k, c.v, **c.meta)  # float32 q over an e4m3 cache
    with pytest.raises(TypeError, match="float8_e5m2 is not supported"):
        ops.dense_attention(c.q.to(torch.bfloat16), c.k.to(torch.float8_e5m2),
                            c.v.to(torch.float8_e5m2), **c.meta)
    with pytest.raises(ValueError, match="writes bfloat16 or float16"):
        ops.prefill_out(*args, torch.empty(c.q.shape), **c.meta)
    with pytest.raises(ValueError, match="k_descale: expected shape"):
        ops.build_index(*args, **c.meta, k_descale=torch.ones(3, 2))
    index = ops.build_index(*args, **c.meta, **c.descales, **SELECT)
    with pytest.raises(ValueError, match=r"v_descale: expected shape"):
        ops.sparse_attention(*args, *index, **c.meta, v_descale=torch.ones(2, 2, 1))
