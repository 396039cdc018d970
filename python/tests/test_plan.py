"""flashprefill.Plan: run() gives what the functional calls give, for every layout, and rejects
tensors that do not fit the plan."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, structured_qkv

CONFIG = fp.SelectConfig(alpha=0.3, sink_tokens=64, window_tokens=128)


def contiguous_problem(rng):
    lens_q, lens_k = [300, 200], [300, 700]
    q, k, v = structured_qkv(rng, 500, 1000, 4, 2, 32)
    return q, k, v, cu_of(lens_q), cu_of(lens_k)


def paged(k, v, cu_k, page_size, rng):
    """The contiguous K/V rows of each request as pages of a shuffled pool."""
    lens = np.diff(cu_k)
    pages_per_seq = -(-lens.max() // page_size)
    num_pages = int(sum(-(-n // page_size) for n in lens)) + 3
    order = rng.permutation(num_pages)
    k_cache = np.zeros((num_pages, page_size) + k.shape[1:], k.dtype)
    v_cache = np.zeros_like(k_cache)
    table = np.zeros((len(lens), pages_per_seq), np.int32)
    used = 0
    for b, n in enumerate(lens):
        for j in range(-(-n // page_size)):
            page = order[used]
            used += 1
            table[b, j] = page
            rows = slice(cu_k[b] + j * page_size, cu_k[b] + min(n, (j + 1) * page_size))
            k_cache[page, :rows.stop - rows.start] = k[rows]
            v_cache[page, :rows.stop - rows.start] = v[rows]
    return k_cache, v_cache, table, lens.astype(np.int32)


@pytest.mark.parametrize("dense", [False, True])
def test_contiguous_run_equals_functional(rng, dense):
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    plan = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k,
                   config=CONFIG, dense=dense)
    if dense:
        expected = fp.dense_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                      return_lse=True)
    else:
        expected = fp.prefill(q, k, v, alpha=0.3, sink_tokens=64, window_tokens=128,
                              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
    for _ in range(2):  # the second run reuses the plan's problem and workspace
        out, lse = plan.run(q, k, v, return_lse=True)
        np.testing.assert_array_equal(out, expected[0])
        np.testing.assert_array_equal(lse, expected[1])


def test_layers_share_one_plan(rng):
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    plan = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k, config=CONFIG)
    layers = [structured_qkv(rng, 500, 1000, 4, 2, 32) for _ in range(3)]
    outs = [plan.run(*layer) for layer in layers]
    for layer, out in zip(layers, outs):
        expected = fp.prefill(*layer, alpha=0.3, sink_tokens=64, window_tokens=128,
                              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_run_equals_contiguous(rng, page_size):
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    k_cache, v_cache, table, lens = paged(k, v, cu_k, page_size, rng)
    plan = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, seqlens_k=lens,
                   page_table=table, config=CONFIG)
    out = np.full_like(q, np.nan)
    assert plan.run(q, k_cache, v_cache, out=out) is out
    expected = fp.prefill(q, k, v, alpha=0.3, sink_tokens=64, window_tokens=128,
                          cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(out, expected)


def test_run_rejects_what_does_not_fit(rng):
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    plan = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="q: expected"):
        plan.run(q[:, :2], k, v)
    with pytest.raises(TypeError, match="dtype float16 differs"):
        plan.run(q.astype(np.float16), k, v)
    with pytest.raises(ValueError, match="k has shape"):
        plan.run(q, k, v[:999])
    with pytest.raises(ValueError, match="out: expected shape"):
        plan.run(q, k, v, out=np.empty((499, 4, 32), np.float32))
    with pytest.raises(fp.FlashPrefillError, match="cu_seqlens_q"):
        plan.run(q[:499], k, v)  # the library checks the totals against the metadata


def test_plan_rejects_bad_layouts(rng):
    _, _, _, cu_q, cu_k = contiguous_problem(rng)
    with pytest.raises(ValueError, match="not both or neither"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700)
    with pytest.raises(ValueError, match="both seqlens_k and page_table"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, seqlens_k=[300, 700])
    with pytest.raises(TypeError, match="max_seqlen_q: expected a Python int"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, None, 700, cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match=r"max_seqlen_k must lie in \[0, 2\^31\)"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 2**31, cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="cu_seqlens_k has shape"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k[:2])
    with pytest.raises(TypeError, match="SelectConfig"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k, config={})
