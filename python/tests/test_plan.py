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


def test_tuning_reaches_the_library_and_leaves_cpu_results_alone(rng):
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    common = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    expected = fp.prefill(q, k, v, alpha=0.3, sink_tokens=64, window_tokens=128, **common)
    tuning = fp.AttentionTuning(num_splits=4, head_section=2, lead_tiles=1)
    plan = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k,
                   config=CONFIG, tuning=tuning)
    np.testing.assert_array_equal(plan.run(q, k, v), expected)
    np.testing.assert_array_equal(
        fp.prefill(q, k, v, alpha=0.3, sink_tokens=64, window_tokens=128, tuning=tuning,
                   **common), expected)
    np.testing.assert_array_equal(fp.dense_attention(q, k, v, tuning=tuning, **common),
                                  fp.dense_attention(q, k, v, **common))
    bad = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k,
                  tuning=fp.AttentionTuning(head_section=3))
    with pytest.raises(fp.FlashPrefillError, match="tuning.head_section"):
        bad.run(q, k, v)


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


def test_paged_total_k_bounds_the_keys(rng):
    """total_k bounds the paged requests' keys: the exact sum runs as without it, one key less
    is the library's error, and contiguous KV takes none."""
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    k_cache, v_cache, table, lens = paged(k, v, cu_k, 16, rng)
    keys = int(np.asarray(lens).sum())
    want = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, seqlens_k=lens,
                   page_table=table, config=CONFIG).run(q, k_cache, v_cache)
    got = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, seqlens_k=lens, page_table=table,
                  config=CONFIG, total_k=keys).run(q, k_cache, v_cache)
    np.testing.assert_array_equal(got, want)
    short = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, seqlens_k=lens,
                    page_table=table, config=CONFIG, total_k=keys - 1)
    with pytest.raises(fp.FlashPrefillError, match=f"more than total_k = {keys - 1}"):
        short.run(q, k_cache, v_cache)
    with pytest.raises(ValueError, match="total_k applies to paged KV"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k, total_k=keys)
    with pytest.raises(ValueError, match="total_k must lie in"):
        fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, seqlens_k=lens, page_table=table,
                total_k=0)


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


def test_cuda_plan_matches_functional_and_captures_in_a_graph(rng):
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and fp.cuda_available()):
        pytest.skip("needs torch with a GPU and the library's CUDA path")
    lens_q, lens_k = [640, 384], [640, 1408]
    to_cuda = lambda a: torch.from_numpy(a).to("cuda", torch.bfloat16)  # noqa: E731
    q, k, v = (to_cuda(a) for a in structured_qkv(rng, 1024, 2048, 8, 2, 128))
    cu_q = torch.from_numpy(cu_of(lens_q)).cuda()
    cu_k = torch.from_numpy(cu_of(lens_k)).cuda()
    plan = fp.Plan(8, 2, 128, torch.bfloat16, "cuda", cu_q, 640, 1408, cu_seqlens_k=cu_k,
                   config=CONFIG)
    expected = fp.prefill(q, k, v, alpha=0.3, sink_tokens=64, window_tokens=128,
                          cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert plan.run(q, k, v).equal(expected)  # the first run validates the metadata
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, out=out)
    q2, k2, v2 = (to_cuda(a) for a in structured_qkv(rng, 1024, 2048, 8, 2, 128))
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    assert out.equal(fp.prefill(q, k, v, alpha=0.3, sink_tokens=64, window_tokens=128,
                                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))


def test_plan_range_checks_its_integers(rng):
    _, _, _, cu_q, cu_k = contiguous_problem(rng)
    with pytest.raises(ValueError, match="num_heads_q = 4294967300 does not fit in int32"):
        fp.Plan(2**32 + 4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k)


@pytest.mark.parametrize("mean_correction", [True, False])
def test_run_with_kept_means_equals_run_without(rng, mean_correction):
    """A second chunk that pools only its new blocks into means kept from the first gives the
    run without means bit for bit (output and lse), and leaves every block's mean behind."""
    config = fp.SelectConfig(alpha=0.3, sink_tokens=64, window_tokens=128,
                             mean_correction=mean_correction)
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    plan = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k,
                   config=config)
    assert plan.means_shape == (2, 2, 6, 32)
    # The first chunk: request 1's first 450 keys (request 0 whole), pooled from scratch.
    first_cu_k = cu_of([300, 450])
    first_k = np.concatenate([k[:300], k[300:750]])
    first_v = np.concatenate([v[:300], v[300:750]])
    pooled = fp.pool_kv(q, first_k, first_v, config, cu_seqlens_q=cu_of([300, 200]),
                        cu_seqlens_k=first_cu_k, max_seqlen_q=300, max_seqlen_k=700)
    means = tuple(None if m is None else m.copy() for m in pooled)
    expected = plan.run(q, k, v, return_lse=True)
    got = plan.run(q, k, v, return_lse=True, means=means, pooled_keys=[300, 450])
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    fresh = fp.pool_kv(q, k, v, config, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for kept, want in zip(means, fresh):
        if want is not None:
            np.testing.assert_array_equal(kept[0, :, :3], want[0, :, :3])
            np.testing.assert_array_equal(kept[1], want[1])
    # A stale lower block is taken as it is: the means are the caller's to keep current.
    # Block 1 of request 1 (forced by no rule) made to match its queries becomes the
    # highest-energy block, selected; made to oppose them, it drops below alpha. Whether the
    # fresh selection held it or not, one of the two stale means changes request 1's output,
    # and neither touches request 0's.
    toward = q[300:].reshape(200, 2, 2, 32).mean(axis=(0, 2))
    changed = False
    for sign in (10.0, -10.0):
        means[0][1, :, 1] = sign * toward
        stale = plan.run(q, k, v, means=means, pooled_keys=[300, 450])
        changed |= not np.array_equal(stale[300:], expected[0][300:])
        np.testing.assert_array_equal(stale[:300], expected[0][:300])
    assert changed
    # pooled_keys None pools every block.
    again = plan.run(q, k, v, means=means)
    np.testing.assert_array_equal(again, expected[0])


def test_run_with_kept_means_rejects_what_does_not_fit(rng):
    q, k, v, cu_q, cu_k = contiguous_problem(rng)
    plan = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k)
    means = tuple(np.zeros(plan.means_shape, np.float32) for _ in range(2))
    with pytest.raises(ValueError, match="pooled_keys: given without means"):
        plan.run(q, k, v, pooled_keys=[0, 0])
    with pytest.raises(TypeError, match=r"means: expected \(k_mean, v_mean\)"):
        plan.run(q, k, v, means=means[0])
    with pytest.raises(ValueError, match="v_mean must be given with mean correction"):
        plan.run(q, k, v, means=(means[0], None))
    with pytest.raises(ValueError, match=r"k_mean: expected shape \(2, 2, 6, 32\)"):
        plan.run(q, k, v, means=(means[0][:, :, :5], means[1]))
    with pytest.raises(ValueError, match="v_mean: expected dtype float32"):
        plan.run(q, k, v, means=(means[0], means[1].astype(np.float16)))
    with pytest.raises(ValueError, match="k_mean: must be contiguous"):
        plan.run(q, k, v, means=(np.zeros((2, 6, 2, 32), np.float32).transpose(0, 2, 1, 3),
                                 means[1]))
    with pytest.raises(ValueError, match=r"pooled_keys: expected shape \[B = 2\]"):
        plan.run(q, k, v, means=means, pooled_keys=[0])
    with pytest.raises(fp.FlashPrefillError, match="pooled_keys"):
        plan.run(q, k, v, means=means, pooled_keys=[0, 701])  # past L_kv: the library's check
    dense = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k, dense=True)
    with pytest.raises(ValueError, match="a dense plan builds no index"):
        dense.run(q, k, v, means=means)
    uncorrected = fp.Plan(4, 2, 32, np.float32, None, cu_q, 300, 700, cu_seqlens_k=cu_k,
                          config=fp.SelectConfig(mean_correction=False))
    with pytest.raises(ValueError, match="None without it"):
        uncorrected.run(q, k, v, means=means)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="k_mean is on torch:cpu but plan is on numpy"):
        plan.run(q, k, v, means=(torch.zeros(plan.means_shape), means[1]))
