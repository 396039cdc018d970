"""torch tensors: CPU tensors give the numpy results; CUDA tensors (when torch sees a GPU and the
library has its CUDA path) match the CPU reference within the ALGORITHM.md tolerances."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, random_qkv, reference_attention, rel_l2, structured_qkv

torch = pytest.importorskip("torch")

needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and fp.cuda_available()),
                                reason="needs torch with a GPU and the library's CUDA path")


def to_torch(arrays, device="cpu", dtype=torch.float32):
    return [torch.from_numpy(a).to(device=device, dtype=dtype) for a in arrays]


def test_cpu_tensors_match_numpy(rng):
    lens_q, lens_kv = [300, 200], [300, 700]
    arrays = structured_qkv(rng, 500, 1000, 4, 2, 32)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_kv)
    params = dict(alpha=0.3, sink_tokens=64, window_tokens=128)
    expected, expected_stats = fp.prefill(*arrays, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                          return_stats=True, **params)
    q, k, v = to_torch(arrays)
    out, stats = fp.prefill(q, k, v, cu_seqlens_q=torch.from_numpy(cu_q),
                            cu_seqlens_k=torch.from_numpy(cu_k).long(), return_stats=True,
                            **params)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), expected)
    assert stats == expected_stats


def test_cpu_index_and_paged_kv(rng):
    arrays = structured_qkv(rng, 512, 512, 4, 2, 32)
    config = fp.SelectConfig(alpha=0.3, sink_tokens=0, window_tokens=64)
    expected_index = fp.build_index(*arrays, config)
    expected = fp.sparse_attention(*arrays, index=expected_index)
    q, k, v = to_torch(arrays)
    index = fp.build_index(q, k, v, config)
    assert isinstance(index.cu, torch.Tensor) and index.cu.dtype == torch.int32
    np.testing.assert_array_equal(index.cu.numpy(), expected_index.cu)
    assert index.segment(0, 1, 3).tolist() == expected_index.segment(0, 1, 3).tolist()
    assert index.density() == expected_index.density()
    np.testing.assert_array_equal(fp.sparse_attention(q, k, v, index).numpy(), expected)
    table = torch.randperm(16, dtype=torch.int32)[None]
    k_cache = torch.empty(16, 32, 2, 32)
    v_cache = torch.empty(16, 32, 2, 32)
    k_cache[table[0].long()] = k.reshape(16, 32, 2, 32)
    v_cache[table[0].long()] = v.reshape(16, 32, 2, 32)
    paged = fp.PagedKV(k_cache, v_cache, table, torch.tensor([512]))
    np.testing.assert_array_equal(fp.sparse_attention(q, paged, index=index).numpy(), expected)


def test_cpu_bfloat16(rng):
    arrays = random_qkv(rng, 256, 384, 4, 2, 64)
    q, k, v = to_torch(arrays, dtype=torch.bfloat16)
    out, lse = fp.dense_attention(q, k, v, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref, _ = reference_attention(*(t.float().numpy() for t in (q, k, v)))
    assert rel_l2(out.float().numpy(), ref) <= 1e-2


def test_mixed_places_are_refused(rng):
    q, k, v = random_qkv(rng, 64, 64, 2, 2, 16)
    with pytest.raises(ValueError, match="same place"):
        fp.dense_attention(torch.from_numpy(q), k, v)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_matches_cpu_reference(rng, dtype):
    lens_q, lens_kv = [1024, 300], [1024, 2000]
    arrays = structured_qkv(rng, 1324, 3024, 8, 2, 128)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_kv)
    params = dict(alpha=0.2, sink_tokens=128, window_tokens=256)
    on_cpu = to_torch(arrays, "cpu", dtype)
    expected = fp.prefill(*on_cpu, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **params)
    expected_dense = fp.dense_attention(*on_cpu, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    q, k, v = (t.cuda() for t in on_cpu)
    out, lse = fp.prefill(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True,
                          **params)
    dense = fp.dense_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert out.device == q.device and out.dtype == dtype and lse.device == q.device
    assert rel_l2(out.float().cpu(), expected.float()) <= 1e-2
    assert rel_l2(dense.float().cpu(), expected_dense.float()) <= 1e-2


@needs_cuda
def test_cuda_graph_capture(rng):
    """With device int32 metadata, max lengths given and no validation, a call never
    synchronizes and can be captured and replayed."""
    arrays = structured_qkv(rng, 512, 512, 4, 2, 128)
    q, k, v = to_torch(arrays, "cuda", torch.bfloat16)
    cu = torch.tensor([0, 512], dtype=torch.int32, device="cuda")
    kwargs = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=512, max_seqlen_k=512,
                  validate_metadata=False)
    expected = fp.prefill(q, k, v, **kwargs)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp.prefill(q, k, v, out=out, **kwargs)
        with torch.cuda.graph(graph):
            fp.prefill(q, k, v, out=out, **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected)


@needs_cuda
def test_cuda_paged_and_index(rng):
    length, page_size = 1536, 64
    arrays = structured_qkv(rng, length, length, 8, 2, 128)
    q, k, v = to_torch(arrays, "cuda", torch.bfloat16)
    config = fp.SelectConfig(alpha=0.2, sink_tokens=128, window_tokens=256)
    index = fp.build_index(q, k, v, config)
    expected_index = fp.build_index(*(t.cpu() for t in (q, k, v)), config)
    assert abs(index.density() - expected_index.density()) < 0.02
    np.testing.assert_allclose(index.k_mean.cpu().numpy(), expected_index.k_mean.numpy(),
                               rtol=2**-8, atol=1e-6)
    contiguous = fp.sparse_attention(q, k, v, index)
    num_pages = length // page_size
    table = torch.randperm(num_pages, dtype=torch.int32, device="cuda")[None]
    k_cache = torch.empty((num_pages, page_size, 2, 128), dtype=k.dtype, device="cuda")
    v_cache = torch.empty_like(k_cache)
    k_cache[table[0].long()] = k.reshape(num_pages, page_size, 2, 128)
    v_cache[table[0].long()] = v.reshape(num_pages, page_size, 2, 128)
    seqlens = torch.tensor([length], dtype=torch.int32, device="cuda")
    paged = fp.sparse_attention(q, fp.PagedKV(k_cache, v_cache, table, seqlens), index=index)
    assert rel_l2(paged.float().cpu(), contiguous.float().cpu()) <= 1e-3


@needs_cuda
def test_cuda_chunked_pooling_equals_full_pooling(rng):
    arrays = structured_qkv(rng, 600, 1000, 8, 2, 128)
    q, k, v = to_torch(arrays, device="cuda", dtype=torch.bfloat16)
    config = fp.SelectConfig()
    fresh = fp.build_index(q, k, v, config=config)
    first = fp.pool_kv(q[300:400], k[:400], v[:400], config=config)
    sized = (torch.zeros_like(fresh.k_mean), torch.zeros_like(fresh.v_mean))
    for dst, src in zip(sized, first):
        dst[:, :, :src.shape[2]] = src
    means = fp.pool_kv(q, k, v, config=config, means=sized,
                       pooled_keys=torch.tensor([400], device="cuda"))
    used = (1000 + 127) // 128
    for got, want in zip(means, (fresh.k_mean, fresh.v_mean)):
        assert torch.equal(got[:, :, :used], want[:, :, :used])
    reused = fp.build_index(q, k, v, config=config, means=means)
    assert torch.equal(reused.cu, fresh.cu)
    n = int(fresh.cu[-1])
    assert torch.equal(reused.idx[:n], fresh.idx[:n])
