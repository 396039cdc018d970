"""A PagedKV gives the same numbers as the contiguous KV it was scattered from."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, random_qkv


def scatter_to_pages(rng, k, v, lens_kv, page_size, spare_pages=3):
    """k, v [total_k, Hkv, D] -> PagedKV with shuffled pages, NaN-poisoned spare pages and
    out-of-range entries in the unused tail of the page table (never to be read)."""
    pages_per_seq = [-(-n // page_size) for n in lens_kv]
    num_pages = sum(pages_per_seq) + spare_pages
    max_pages = max(pages_per_seq) + 2
    shape = (num_pages, page_size) + k.shape[1:]
    k_cache = np.full(shape, np.nan, dtype=k.dtype)
    v_cache = np.full(shape, np.nan, dtype=v.dtype)
    order = rng.permutation(num_pages)
    table = np.full((len(lens_kv), max_pages), num_pages + 1000, dtype=np.int32)
    row0, used = 0, 0
    for b, n in enumerate(lens_kv):
        for p in range(pages_per_seq[b]):
            page = order[used]
            used += 1
            table[b, p] = page
            rows = slice(p * page_size, min((p + 1) * page_size, n))
            count = rows.stop - rows.start
            k_cache[page, :count] = k[row0 + rows.start:row0 + rows.stop]
            v_cache[page, :count] = v[row0 + rows.start:row0 + rows.stop]
        row0 += n
    return fp.PagedKV(k_cache, v_cache, table, np.array(lens_kv, dtype=np.int32))


@pytest.mark.parametrize("page_size", [1, 16, 100])
def test_paged_equals_contiguous(rng, page_size):
    lens_q, lens_kv = [200, 300], [700, 300]
    q, k, v = random_qkv(rng, sum(lens_q), sum(lens_kv), 4, 2, 32)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_kv)
    paged = scatter_to_pages(rng, k, v, lens_kv, page_size)
    params = dict(alpha=0.3, sink_tokens=64, window_tokens=128)
    for call, extra in [(fp.dense_attention, {}), (fp.prefill, params)]:
        expected, expected_lse = call(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                      return_lse=True, **extra)
        out, lse = call(q, paged, cu_seqlens_q=cu_q, return_lse=True, **extra)
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(lse, expected_lse, rtol=1e-6, atol=1e-6)


def test_paged_index_equals_contiguous_index(rng):
    lens = [640]
    q, k, v = random_qkv(rng, 640, 640, 2, 2, 32)
    paged = scatter_to_pages(rng, k, v, lens, 16)
    config = fp.SelectConfig(alpha=0.4, sink_tokens=0, window_tokens=0)
    expected = fp.build_index(q, k, v, config)
    index = fp.build_index(q, paged, config=config)
    np.testing.assert_array_equal(index.cu, expected.cu)
    used = int(expected.cu[-1])
    np.testing.assert_array_equal(index.idx[:used], expected.idx[:used])
    np.testing.assert_allclose(index.k_mean, expected.k_mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(index.v_mean, expected.v_mean, rtol=1e-6, atol=1e-7)


def test_strided_page_cache(rng):
    """A cache whose pages are slices of a wider buffer (k and v interleaved per page)."""
    q, k, v = random_qkv(rng, 300, 300, 2, 2, 16)
    paged = scatter_to_pages(rng, k, v, [300], 32)
    kv = np.stack([paged.k_cache, paged.v_cache], axis=1)
    interleaved = fp.PagedKV(kv[:, 0], kv[:, 1], paged.page_table, paged.seqlens_k)
    assert not interleaved.k_cache.flags.c_contiguous
    np.testing.assert_array_equal(fp.dense_attention(q, interleaved),
                                  fp.dense_attention(q, paged))
