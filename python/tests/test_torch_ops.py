"""torch.ops.flashprefill.*: the same results as the functional API, torch.library.opcheck,
torch.compile(fullgraph=True), and (on a GPU) CUDA-graph capture."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, reference_attention, rel_l2, structured_qkv

torch = pytest.importorskip("torch")
import flashprefill.torch as fpt  # noqa: E402 - registers the ops; needs torch

ops = torch.ops.flashprefill
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and fp.cuda_available()),
                                reason="needs torch with a GPU and the library's CUDA path")
SELECT = dict(alpha=0.3, sink_tokens=64, window_tokens=128)


def problem(rng, device="cpu", dtype=torch.float32, lens_q=(300, 200), lens_k=(300, 700),
            heads=(4, 2), dim=32):
    arrays = structured_qkv(rng, sum(lens_q), sum(lens_k), *heads, dim)
    q, k, v = (torch.from_numpy(a).to(device=device, dtype=dtype) for a in arrays)
    meta = dict(cu_seqlens_q=torch.from_numpy(cu_of(lens_q)).to(device),
                cu_seqlens_k=torch.from_numpy(cu_of(lens_k)).to(device),
                max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    return q, k, v, meta


def paged_kv(k, v, cu_k, page_size, gen):
    """[num_pages, page_size, Hkv, D] caches holding each request's rows in shuffled pages."""
    lens = (cu_k[1:] - cu_k[:-1]).tolist()
    per_seq = max(-(-n // page_size) for n in lens)
    num_pages = sum(-(-n // page_size) for n in lens) + 2
    order = torch.randperm(num_pages, generator=gen).tolist()
    k_cache = torch.zeros((num_pages, page_size) + tuple(k.shape[1:]), dtype=k.dtype,
                          device=k.device)
    v_cache = torch.zeros_like(k_cache)
    table = torch.zeros((len(lens), per_seq), dtype=torch.int32)
    for b, n in enumerate(lens):
        for j in range(-(-n // page_size)):
            page = order.pop()
            table[b, j] = page
            start, stop = int(cu_k[b]) + j * page_size, int(cu_k[b]) + min(n, (j + 1) * page_size)
            k_cache[page, :stop - start] = k[start:stop]
            v_cache[page, :stop - start] = v[start:stop]
    return (k_cache, v_cache, table.to(k.device),
            torch.tensor(lens, dtype=torch.int32, device=k.device))


def test_prefill_and_dense_match_functional(rng):
    q, k, v, meta = problem(rng)
    np_meta = {key: (val.numpy() if isinstance(val, torch.Tensor) else val)
               for key, val in meta.items()}
    expected = fp.prefill(q.numpy(), k.numpy(), v.numpy(), **SELECT, **np_meta)
    np.testing.assert_array_equal(ops.prefill(q, k, v, **meta, **SELECT).numpy(), expected)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, q.shape[0]), float("nan"))
    ops.prefill_out(q, k, v, out, lse, **meta, **SELECT)
    np.testing.assert_array_equal(out.numpy(), expected)
    dense, dense_lse = fp.dense_attention(q.numpy(), k.numpy(), v.numpy(), return_lse=True,
                                          **np_meta)
    np.testing.assert_array_equal(ops.dense_attention(q, k, v, **meta).numpy(), dense)
    ops.dense_attention_out(q, k, v, out, lse, **meta)
    np.testing.assert_array_equal(out.numpy(), dense)
    np.testing.assert_array_equal(lse.numpy(), dense_lse)


def test_int32_metadata_reuses_plans_and_follows_its_contents(rng):
    q, k, v, meta = problem(rng)
    meta = {key: (val.to(torch.int32) if isinstance(val, torch.Tensor) else val)
            for key, val in meta.items()}
    first = ops.prefill(q, k, v, **meta, **SELECT)
    assert ops.prefill(q, k, v, **meta, **SELECT).equal(first)
    # The same tensors with other contents: a reused plan reads them as they are now.
    meta["cu_seqlens_q"].copy_(torch.tensor([0, 200, 500], dtype=torch.int32))
    meta["cu_seqlens_k"].copy_(torch.tensor([0, 600, 1000], dtype=torch.int32))
    got = ops.prefill(q, k, v, **meta, **SELECT)
    expected = fp.prefill(q.numpy(), k.numpy(), v.numpy(), cu_seqlens_q=[0, 200, 500],
                          cu_seqlens_k=[0, 600, 1000], **SELECT)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_index_ops_compose(rng):
    q, k, v, meta = problem(rng)
    cu, idx, k_mean, v_mean = ops.build_index(q, k, v, **meta, **SELECT)
    expected = fp.build_index(q.numpy(), k.numpy(), v.numpy(), fp.SelectConfig(**SELECT),
                              cu_seqlens_q=meta["cu_seqlens_q"].numpy(),
                              cu_seqlens_k=meta["cu_seqlens_k"].numpy())
    np.testing.assert_array_equal(cu.numpy(), expected.cu)
    assert idx.shape == expected.idx.shape
    np.testing.assert_array_equal(idx[:int(cu[-1])].numpy(), expected.idx[:int(cu[-1])])
    for b, blocks in enumerate((3, 6)):  # ceil(L_kv / 128); later blocks are unspecified
        np.testing.assert_array_equal(k_mean[b, :, :blocks].numpy(),
                                      expected.k_mean[b, :, :blocks])
    out = ops.sparse_attention(q, k, v, cu, idx, k_mean, v_mean, **meta)
    np.testing.assert_array_equal(out.numpy(), ops.prefill(q, k, v, **meta, **SELECT).numpy())
    # pool_kv into zeroed means reproduces the index stage's pooling; build_index_out then
    # scores and selects on them alone.
    pooled_k, pooled_v = k_mean.clone(), v_mean.clone()
    ops.pool_kv(q, k, v, pooled_k, pooled_v, **meta)
    assert pooled_k.equal(k_mean) and pooled_v.equal(v_mean)
    cu2, idx2 = torch.empty_like(cu), torch.empty_like(idx)
    ops.build_index_out(q, k, v, cu2, idx2, pooled_k, pooled_v, **meta, **SELECT,
                        means_pooled=True)
    assert cu2.equal(cu) and idx2[:int(cu[-1])].equal(idx[:int(cu[-1])])


def test_paged_ops(rng):
    q, k, v, meta = problem(rng)
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    k_cache, v_cache, table, lens = paged_kv(k, v, meta["cu_seqlens_k"], 16, gen)
    paged = dict(cu_seqlens_q=meta["cu_seqlens_q"], page_table=table, seqlens_k=lens,
                 max_seqlen_q=meta["max_seqlen_q"], max_seqlen_k=meta["max_seqlen_k"])
    expected = ops.prefill(q, k, v, **meta, **SELECT)
    assert ops.prefill(q, k_cache, v_cache, **paged, **SELECT).equal(expected)
    index = ops.build_index(q, k_cache, v_cache, **paged, **SELECT)
    assert ops.sparse_attention(q, k_cache, v_cache, *index, **paged).equal(expected)


def opcheck_cases(rng):
    q, k, v, meta = problem(rng, lens_q=(130, 70), lens_k=(130, 300), heads=(2, 1), dim=16)
    cu, idx, k_mean, v_mean = ops.build_index(q, k, v, **meta, **SELECT)
    out, lse = torch.empty_like(q), torch.empty(2, q.shape[0])
    return [
        (ops.prefill, (q, k, v), dict(meta, **SELECT)),
        (ops.prefill_out, (q, k, v, out, lse), dict(meta, **SELECT)),
        (ops.dense_attention, (q, k, v), meta),
        (ops.dense_attention_out, (q, k, v, out, lse), meta),
        (ops.build_index, (q, k, v), dict(meta, **SELECT)),
        (ops.build_index_out, (q, k, v, cu.clone(), idx.clone(), k_mean.clone(),
                               v_mean.clone()), dict(meta, **SELECT)),
        (ops.pool_kv, (q, k, v, k_mean.clone(), v_mean.clone()), meta),
        (ops.sparse_attention, (q, k, v, cu, idx, k_mean, v_mean), meta),
        (ops.sparse_attention_out, (q, k, v, cu, idx, k_mean, v_mean, out, lse), meta),
    ]


def test_opcheck(rng):
    for op, args, kwargs in opcheck_cases(rng):
        torch.library.opcheck(op, args, kwargs)


def test_compile_fullgraph(rng):
    q, k, v, meta = problem(rng)

    def layer(q, k, v, cu_q, cu_k):
        index = ops.build_index(q, k, v, cu_q, cu_k, max_seqlen_q=300, max_seqlen_k=700,
                                **SELECT)
        sparse = ops.sparse_attention(q, k, v, *index, cu_q, cu_k, max_seqlen_q=300,
                                      max_seqlen_k=700)
        whole = ops.prefill(q * 1.0, k, v, cu_q, cu_k, max_seqlen_q=300, max_seqlen_k=700,
                            **SELECT)
        dense = ops.dense_attention(q, k, v, cu_q, cu_k, max_seqlen_q=300, max_seqlen_k=700)
        return sparse + 0.0, whole, dense

    compiled = torch.compile(layer, fullgraph=True, backend="inductor")
    args = (q, k, v, meta["cu_seqlens_q"], meta["cu_seqlens_k"])
    for got, want in zip(compiled(*args), layer(*args)):
        assert got.equal(want)


def test_errors_reach_the_caller(rng):
    q, k, v, meta = problem(rng)
    with pytest.raises(fp.FlashPrefillError, match="alpha must lie in"):
        ops.prefill(q, k, v, **meta, alpha=2.0)
    with pytest.raises(ValueError, match="both page_table and seqlens_k"):
        ops.prefill(q, k, v, meta["cu_seqlens_q"], page_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="needs max_seqlen_q and max_seqlen_k"):
        fpt._index_outputs(q, k, meta["cu_seqlens_q"], None, None, 700, fp.SelectConfig())


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_ops_match_cpu_reference_and_capture_in_a_graph(rng, dtype):
    lens_q, lens_k = (640, 384), (640, 1408)
    q, k, v, meta = problem(rng, "cuda", dtype, lens_q, lens_k, (8, 2), 128)
    meta = {key: (val.to(torch.int32) if isinstance(val, torch.Tensor) else val)
            for key, val in meta.items()}
    ref, _ = reference_attention(*(t.float().cpu().numpy() for t in (q, k, v)),
                                 cu_of(lens_q), cu_of(lens_k))
    dense = ops.dense_attention(q, k, v, **meta)
    assert rel_l2(dense.float().cpu().numpy(), ref) < 1e-2
    sparse = ops.prefill(q, k, v, **meta, **SELECT)
    assert rel_l2(sparse.float().cpu().numpy(), ref) < 5e-2
    # Captured with device metadata, maxima given and no validation: replays compute the
    # same outputs on new inputs copied into the captured tensors.
    out = torch.empty_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.prefill_out(q, k, v, out, **meta, **SELECT, validate_metadata=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.prefill_out(q, k, v, out, **meta, **SELECT, validate_metadata=False)
        dense_out = ops.dense_attention(q, k, v, **meta, validate_metadata=False)
    q2, k2, v2, _ = problem(rng, "cuda", dtype, lens_q, lens_k, (8, 2), 128)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert out.equal(ops.prefill(q, k, v, **meta, **SELECT))
    assert dense_out.equal(ops.dense_attention(q, k, v, **meta))
