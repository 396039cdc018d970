"""Incremental pooling for chunked prefill: fp_pool_kv and build_index(means=...)."""

import numpy as np
import pytest

import flashprefill as fp


def _inputs(rng, lq, lkv, hq=4, hkv=2, d=32):
    q = rng.standard_normal((lq, hq, d), dtype=np.float32)
    k = rng.standard_normal((lkv, hkv, d), dtype=np.float32)
    v = rng.standard_normal((lkv, hkv, d), dtype=np.float32)
    return q, k, v


def test_chunked_pooling_equals_full_pooling():
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, 500, 900)
    config = fp.SelectConfig()
    fresh = fp.build_index(q, k, v, config=config)
    # First chunk: keys [0, 400) and its last 100 queries; then the whole sequence from 400 on.
    first = fp.pool_kv(q[300:400], k[:400], v[:400], config=config)
    sized = (np.zeros_like(fresh.k_mean), np.zeros_like(fresh.v_mean))
    blocks = first[0].shape[2]
    for dst, src in zip(sized, first):
        dst[:, :, :blocks] = src
    means = fp.pool_kv(q, k, v, config=config, means=sized, pooled_keys=[400])
    used = (900 + 127) // 128
    np.testing.assert_array_equal(means[0][:, :, :used], fresh.k_mean[:, :, :used])
    np.testing.assert_array_equal(means[1][:, :, :used], fresh.v_mean[:, :, :used])
    reused = fp.build_index(q, k, v, config=config, means=means)
    np.testing.assert_array_equal(reused.cu, fresh.cu)
    n = int(fresh.cu[-1])
    np.testing.assert_array_equal(reused.idx[:n], fresh.idx[:n])


def test_pooled_keys_out_of_range_is_an_error():
    rng = np.random.default_rng(6)
    q, k, v = _inputs(rng, 10, 50)
    with pytest.raises(fp.FlashPrefillError, match="pooled_keys"):
        fp.pool_kv(q, k, v, pooled_keys=[51])


def test_means_of_the_wrong_shape_are_refused():
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, 10, 300)
    bad = (np.zeros((1, 2, 2, 32), np.float32), np.zeros((1, 2, 2, 32), np.float32))
    with pytest.raises(ValueError, match="shape"):
        fp.pool_kv(q, k, v, means=bad)
