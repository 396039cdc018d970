"""flashprefill.sglang.layout (no SGLang needed) against the library's contiguous call.

Tensors are laid out as SGLang holds them: a token pool [size + page_size, Hkv, D] per layer (and
its HND form [num_pages, Hkv, page_size, D]), req_to_token [rows, max_context_len] with the
batch's rows in req_pool_indices, pages shuffled, cached prefixes first. Runs on the CPU (float32)
and, when the library's CUDA path is usable, on the GPU (bfloat16).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashprefill as fp
from flashprefill.sglang.layout import ExtendAttention, Settings, page_table, paged_kv
from conftest import rel_l2

HEADS_Q, HEADS_KV, HEAD_DIM = 4, 2, 64

PLACES = [("cpu", torch.float32)]
if torch.cuda.is_available() and fp.cuda_available():
    PLACES.append(("cuda", torch.bfloat16))


def sglang_layout(rng, prefix, new, page_size, device, dtype, heads_kv=HEADS_KV,
                  head_dim=HEAD_DIM):
    """(k_pool, v_pool [size + page_size, Hkv, D], req_to_token, req_pool_indices, slots of
    every request): each request on shuffled pages of the pool, page 0 left as padding."""
    lengths = [p + n for p, n in zip(prefix, new)]
    pages = [-(-L // page_size) for L in lengths]
    num_pages = sum(pages) + 2
    rows = (num_pages - 1) * page_size + page_size  # SGLang's size + page_size
    k_pool = torch.from_numpy(rng.standard_normal((rows, heads_kv, head_dim)).astype(np.float32))
    v_pool = torch.from_numpy(rng.standard_normal((rows, heads_kv, head_dim)).astype(np.float32))
    free = list(rng.permutation(np.arange(1, num_pages))[:sum(pages)])
    req_rows = [int(r) for r in rng.permutation(np.arange(1, len(lengths) + 3))[:len(lengths)]]
    req_to_token = torch.zeros((len(lengths) + 3, max(lengths) + 32), dtype=torch.int32)
    slots = []
    for b, L in enumerate(lengths):
        own = [free.pop() for _ in range(pages[b])]
        s = torch.tensor([own[j // page_size] * page_size + j % page_size for j in range(L)])
        req_to_token[req_rows[b], :L] = s.to(torch.int32)
        slots.append(s)
    to = dict(device=device, dtype=dtype)
    return (k_pool.to(**to), v_pool.to(**to), req_to_token.to(device),
            torch.tensor(req_rows, device=device), slots)


def contiguous_reference(q, k_pool, v_pool, slots, new, settings, scale, dense=False):
    k = torch.cat([k_pool[s.to(k_pool.device)] for s in slots])
    v = torch.cat([v_pool[s.to(k_pool.device)] for s in slots])
    cu_q = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum([len(s) for s in slots])]).astype(np.int32)
    if dense:
        return fp.dense_attention(q, k, v, softmax_scale=scale, cu_seqlens_q=cu_q,
                                  cu_seqlens_k=cu_k)
    c = settings.select_config()
    return fp.prefill(q, k, v, softmax_scale=scale, block_size=c.block_size, alpha=c.alpha,
                      sink_tokens=c.sink_tokens, window_tokens=c.window_tokens,
                      dense_recent_tiles=c.dense_recent_tiles, mean_correction=c.mean_correction,
                      cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def _attention(prefix, new, k_pool, req_to_token, req_rows, page_size, settings):
    device = k_pool.device
    lengths = [p + n for p, n in zip(prefix, new)]
    return ExtendAttention(torch.tensor(lengths, device=device), torch.tensor(new, device=device),
                           lengths, new, req_to_token, req_rows, page_size, settings)


@pytest.mark.parametrize("device, dtype", PLACES)
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("alpha", [0.0, 0.1])
def test_pool_layout_matches_contiguous_call(rng, device, dtype, page_size, alpha):
    prefix, new = [0, 700, 0, 1500], [1100, 300, 1, 1]  # a MIXED-like batch with prefixes
    k_pool, v_pool, r2t, rows, slots = sglang_layout(rng, prefix, new, page_size, device, dtype)
    settings = Settings(alpha=alpha, min_sparse_len=0, validate_metadata=True)
    attention = _attention(prefix, new, k_pool, r2t, rows, page_size, settings)
    q = torch.from_numpy(rng.standard_normal((sum(new), HEADS_Q, HEAD_DIM)).astype(np.float32))
    q = q.to(device=device, dtype=dtype)
    scale = 0.11
    out = attention.run(q, paged_kv(k_pool, page_size), paged_kv(v_pool, page_size), scale)
    ref = contiguous_reference(q, k_pool, v_pool, slots, new, settings, scale)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_l2(out.float().cpu(), ref.float().cpu()) <= tol
    # A second layer reuses the plan and its metadata.
    q2 = torch.flip(q, [0]).contiguous()
    out2 = attention.run(q2, paged_kv(k_pool, page_size), paged_kv(v_pool, page_size), scale)
    ref2 = contiguous_reference(q2, k_pool, v_pool, slots, new, settings, scale)
    assert rel_l2(out2.float().cpu(), ref2.float().cpu()) <= tol
    assert len(attention._plans) == 1


@pytest.mark.parametrize("device, dtype", PLACES)
def test_short_requests_dense_and_hnd_pool(rng, device, dtype):
    page_size = 16
    prefix, new = [0, 0, 40], [1300, 200, 90]
    k_pool, v_pool, r2t, rows, slots = sglang_layout(rng, prefix, new, page_size, device, dtype)
    settings = Settings(min_sparse_len=1024, validate_metadata=True)
    attention = _attention(prefix, new, k_pool, r2t, rows, page_size, settings)
    q = torch.from_numpy(rng.standard_normal((sum(new), HEADS_Q, HEAD_DIM)).astype(np.float32))
    q = q.to(device=device, dtype=dtype)
    # The HND pool SGLANG_USE_HND_KVCACHE makes: [num_pages, Hkv, page_size, D].
    hnd = [x.view(-1, page_size, HEADS_KV, HEAD_DIM).transpose(1, 2).contiguous()
           for x in (k_pool, v_pool)]
    out = attention.run(q, paged_kv(hnd[0], page_size), paged_kv(hnd[1], page_size), None)
    sparse = contiguous_reference(q, k_pool, v_pool, slots, new, settings, None)
    exact = contiguous_reference(q, k_pool, v_pool, slots, new, settings, None, dense=True)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_l2(out[:1300].float().cpu(), sparse[:1300].float().cpu()) <= tol
    assert rel_l2(out[1300:].float().cpu(), exact[1300:].float().cpu()) <= tol


def test_page_table_strides_req_to_token():
    r2t = torch.arange(4 * 40, dtype=torch.int32).reshape(4, 40)
    table = page_table(r2t, torch.tensor([2, 0]), 16, 33)
    assert table.dtype == torch.int32 and table.shape == (2, 3)
    assert table.tolist() == [[80 // 16, 96 // 16, 112 // 16], [0, 1, 2]]
    assert page_table(r2t, torch.tensor([1]), 1, 5).tolist() == [[40, 41, 42, 43, 44]]
    with pytest.raises(ValueError, match="page_size"):
        page_table(r2t, torch.tensor([1]), 0, 5)


def test_paged_kv_is_a_view():
    pool = torch.zeros((64 + 16, HEADS_KV, HEAD_DIM))
    pages = paged_kv(pool, 16)
    assert pages.shape == (5, 16, HEADS_KV, HEAD_DIM)
    assert pages.data_ptr() == pool.data_ptr()
    pages[3, 2] = 1.0
    assert bool((pool[3 * 16 + 2] == 1.0).all())
    with pytest.raises(ValueError, match="KV buffer"):
        paged_kv(torch.zeros(4, 4), 1)


def test_lengths_checked():
    r2t = torch.zeros((2, 8), dtype=torch.int32)
    with pytest.raises(ValueError, match="request 0"):
        ExtendAttention(torch.tensor([2]), torch.tensor([3]), [2], [3], r2t, torch.tensor([1]), 1,
                        Settings())
