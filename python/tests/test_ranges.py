"""Integers reach the C ABI only when they fit its int32 fields (ctypes would keep the low 32
bits); strides of dimensions of size 0 or 1 are free; empty chunks pass through."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import random_qkv


@pytest.fixture
def qkv(rng):
    return random_qkv(rng, 64, 64, 2, 1, 16)


def test_cu_seqlens_beyond_int32(qkv):
    with pytest.raises(ValueError, match="cu_seqlens_q: entry 4294967360 does not fit in int32"):
        fp.dense_attention(*qkv, cu_seqlens_q=np.array([0, 2**32 + 64]),
                           cu_seqlens_k=np.array([0, 64]))


def test_page_table_beyond_int32(qkv, rng):
    q, k, v = qkv
    pages = fp.PagedKV(k.reshape(4, 16, 1, 16), v.reshape(4, 16, 1, 16),
                       np.array([[0, 1, 2**32 + 2, 3]]), np.array([64]))
    with pytest.raises(ValueError, match="page_table: entry 4294967298 does not fit"):
        fp.dense_attention(q, pages)


def test_block_size_beyond_int32(qkv):
    with pytest.raises(ValueError, match="block_size = 4294967424 does not fit in int32"):
        fp.prefill(*qkv, block_size=2**32 + 128)


def test_max_seqlen_beyond_int32(qkv):
    with pytest.raises(ValueError, match="max_seqlen_q = 2147483648 does not fit in int32"):
        fp.dense_attention(*qkv, max_seqlen_q=2**31)
    with pytest.raises(ValueError, match="max_seqlen_k = 2147483648 does not fit in int32"):
        fp.prefill(*qkv, max_seqlen_k=2**31)


def test_loose_bounds_in_range_are_fine(qkv):
    want = fp.prefill(*qkv)
    np.testing.assert_array_equal(fp.prefill(*qkv, max_seqlen_q=2**31 - 1, max_seqlen_k=2**31 - 1),
                                  want)


def test_zero_strides_on_unit_dims(rng):
    q, k, v = random_qkv(rng, 40, 40, 2, 1, 16)
    want = fp.prefill(q, k, v)
    # Hkv = 1 as a broadcast view: the head dimension has stride 0.
    k0, v0 = (np.broadcast_to(x[:, 0:1, :], x.shape) for x in (k, v))
    assert k0.strides[1] == 0
    np.testing.assert_array_equal(fp.prefill(q, k0, v0), want)
    kx, vx = (x[:, 0, :][:, None, :] for x in (k, v))
    np.testing.assert_array_equal(fp.prefill(q, kx, vx), want)


def test_empty_chunk_passes_through(rng):
    q, k, v = random_qkv(rng, 0, 32, 2, 1, 16)
    empty = np.broadcast_to(q, (0, 2, 16))  # zero strides everywhere
    for call in (fp.prefill, fp.dense_attention):
        out = call(empty, k, v)
        assert out.shape == (0, 2, 16)
