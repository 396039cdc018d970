"""prefill: dense at alpha = 0, mean correction at high sparsity, stats, lse."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import random_qkv, reference_attention, rel_l2, structured_qkv

SPARSE = dict(sink_tokens=0, window_tokens=0, dense_recent_tiles=0)


@pytest.mark.parametrize("num_heads_q,num_heads_kv,len_q,len_kv", [
    (4, 4, 1000, 1000), (8, 2, 1024, 1024), (6, 2, 333, 900)])
def test_alpha_zero_equals_dense(rng, num_heads_q, num_heads_kv, len_q, len_kv):
    q, k, v = random_qkv(rng, len_q, len_kv, num_heads_q, num_heads_kv, 64)
    out, lse = fp.prefill(q, k, v, alpha=0.0, return_lse=True, **SPARSE)
    ref, ref_lse = reference_attention(q, k, v)
    assert rel_l2(out, ref) <= 1e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    dense = fp.dense_attention(q, k, v)
    assert rel_l2(out, dense) <= 1e-5


def test_stats_and_two_stage_path_agree(rng):
    q, k, v = structured_qkv(rng, 1024, 1024, 4, 2, 64)
    params = dict(alpha=0.3, sink_tokens=64, window_tokens=128, block_size=128)
    fused = fp.prefill(q, k, v, **params)
    out, lse, stats = fp.prefill(q, k, v, return_stats=True, return_lse=True, **params)
    assert rel_l2(out, fused) <= 1e-6
    assert lse.shape == (4, 1024)
    assert 0.0 < stats["density"] < 1.0
    assert 0 < stats["selected_tiles"] <= stats["idx_capacity"]
    assert stats["num_segments"] == 1 * 2 * stats["max_q_tiles"]
    assert stats["max_q_tiles"] == 2 * 1024 // 128
    assert stats["max_blocks"] == 1024 // 128
    _, dense_stats = fp.prefill(q, k, v, alpha=0.0, return_stats=True)
    assert dense_stats["density"] == 1.0


def test_mean_correction_reduces_error_at_high_sparsity(rng):
    q, k, v = structured_qkv(rng, 1024, 1024, 2, 2, 64)
    ref, _ = reference_attention(q, k, v)
    plain, stats = fp.prefill(q, k, v, alpha=0.5, mean_correction=False, return_stats=True,
                              **SPARSE)
    corrected = fp.prefill(q, k, v, alpha=0.5, mean_correction=True, **SPARSE)
    assert stats["density"] < 0.7
    error_plain, error_corrected = rel_l2(plain, ref), rel_l2(corrected, ref)
    assert error_plain > 1e-2
    assert error_corrected <= error_plain
    assert error_corrected < 0.1 * error_plain


def test_sparse_output_is_finite_and_close(rng):
    q, k, v = random_qkv(rng, 768, 768, 4, 4, 64)
    out = fp.prefill(q, k, v)
    assert np.isfinite(out).all()
    ref, _ = reference_attention(q, k, v)
    assert rel_l2(out, ref) < 0.5
