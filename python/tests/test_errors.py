"""Every library error arrives as FlashPrefillError with its message; what only Python can see
(dimensions, dtypes, places, shapes of k vs v, index buffer sizes) raises ValueError/TypeError."""

import ctypes

import numpy as np
import pytest

import flashprefill as fp
from flashprefill import _arrays, _lib, _problem
from conftest import cu_of, random_qkv

INVALID = fp.Status.INVALID_ARGUMENT


@pytest.fixture
def qkv(rng):
    return random_qkv(rng, 256, 256, 4, 2, 32)


def raises_library_error(status, call, *args, **kwargs):
    with pytest.raises(fp.FlashPrefillError) as caught:
        call(*args, **kwargs)
    error = caught.value
    assert error.status in ((status,) if isinstance(status, fp.Status) else status)
    assert error.message and error.message in str(error)
    assert error.status.name in str(error)
    return error


def test_error_type():
    assert issubclass(fp.FlashPrefillError, RuntimeError)
    error = fp.FlashPrefillError(3, "too small")
    assert error.status is fp.Status.WORKSPACE_TOO_SMALL and error.message == "too small"


def test_heads_not_a_multiple(rng):
    q, k, v = random_qkv(rng, 64, 64, 3, 2, 16)
    raises_library_error(INVALID, fp.dense_attention, q, k, v)
    raises_library_error(INVALID, fp.prefill, q, k, v)


@pytest.mark.parametrize("params", [dict(alpha=1.5), dict(alpha=-0.1), dict(alpha=float("nan")),
                                    dict(block_size=100), dict(block_size=0),
                                    dict(dense_recent_tiles=-1), dict(sink_tokens=-5),
                                    dict(window_tokens=-1)])
def test_bad_select_config(qkv, params):
    raises_library_error(INVALID, fp.prefill, *qkv, **params)


def test_head_dim_too_large_for_the_cpu(rng):
    q, k, v = random_qkv(rng, 8, 8, 1, 1, 513)
    raises_library_error((INVALID, fp.Status.UNSUPPORTED), fp.dense_attention, q, k, v)


@pytest.mark.parametrize("cu_q,cu_k", [
    ([0, 200, 100, 256], [0, 100, 200, 256]),   # cu_seqlens_q decreasing
    ([0, 100, 255], [0, 100, 256]),             # cu_q[B] != total_q
    ([1, 100, 256], [1, 100, 256]),             # cu[0] != 0
    ([0, 150, 256], [0, 100, 256]),             # L_q > L_kv in request 0
])
def test_bad_varlen_metadata(qkv, cu_q, cu_k):
    raises_library_error(INVALID, fp.dense_attention, *qkv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def test_understated_max_seqlen(qkv):
    raises_library_error(INVALID, fp.dense_attention, *qkv, max_seqlen_q=100)


def test_bad_page_table(rng):
    q, k_cache, v_cache = random_qkv(rng, 100, 160, 2, 2, 16)
    k_cache, v_cache = k_cache.reshape(10, 16, 2, 16), v_cache.reshape(10, 16, 2, 16)
    good = np.arange(10, dtype=np.int32)[None]
    fp.dense_attention(q, fp.PagedKV(k_cache, v_cache, good, [160]))
    out_of_range = good.copy()
    out_of_range[0, 3] = 10
    raises_library_error(INVALID, fp.dense_attention, q,
                         fp.PagedKV(k_cache, v_cache, out_of_range, [160]))
    raises_library_error(INVALID, fp.dense_attention, q,
                         fp.PagedKV(k_cache, v_cache, good[:, :9], [160]))
    raises_library_error(INVALID, fp.dense_attention, q,
                         fp.PagedKV(k_cache, v_cache, good, [50]))


def test_foreign_index_not_ascending(qkv):
    q, k, v = qkv
    config = fp.SelectConfig(mean_correction=False)
    sizes = fp.index_sizes(q, k, v, config)
    lists = [[0, 1, 2, 3]] * sizes.num_segments
    lists[0] = [1, 0]
    cu = cu_of([len(ids) for ids in lists])
    idx = np.concatenate(lists).astype(np.int32)
    k_mean = np.zeros((1, 2, sizes.max_blocks, 32), dtype=np.float32)
    raises_library_error(INVALID, fp.sparse_attention, q, k, v, fp.Index(cu, idx, k_mean,
                                                                         config=config))


def test_workspace_too_small(qkv):
    problem = _problem.build_problem(*qkv)
    config = fp.SelectConfig().to_c()
    nbytes = ctypes.c_size_t()
    _lib.call("fp_prefill_workspace_size", ctypes.byref(problem.c), ctypes.byref(config),
              ctypes.byref(nbytes))
    assert nbytes.value > 0
    out = np.empty_like(qkv[0])
    out_array = _arrays.Array(out, "out")
    output = _lib.Output(out_array.ptr, out_array.strides[0], out_array.strides[1], None)
    workspace = _arrays.Workspace(problem.q, nbytes.value)
    with pytest.raises(fp.FlashPrefillError) as caught:
        _lib.call("fp_prefill", ctypes.byref(problem.c), ctypes.byref(config),
                  ctypes.byref(output), workspace.ptr, nbytes.value - 1)
    assert caught.value.status is fp.Status.WORKSPACE_TOO_SMALL and caught.value.message


def test_cuda_problem_without_cuda(qkv):
    if fp.cuda_available():
        pytest.skip("this build has a usable CUDA device")
    problem = _problem.build_problem(*qkv)
    problem.c.device = _lib.Device.CUDA
    nbytes = ctypes.c_size_t()
    with pytest.raises(fp.FlashPrefillError) as caught:
        _lib.call("fp_dense_attention_workspace_size", ctypes.byref(problem.c),
                  ctypes.byref(nbytes))
    assert caught.value.status in (fp.Status.UNSUPPORTED, fp.Status.CUDA)


# What the library cannot see: caught in Python before any struct is built.

def test_head_dimension_must_be_contiguous(qkv):
    q, k, v = qkv
    wide = np.repeat(k, 2, axis=2)[:, :, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        fp.dense_attention(q, wide, v)


def test_wrong_dimensions(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="3 dimensions"):
        fp.dense_attention(q[0], k, v)
    with pytest.raises(ValueError, match="4 dimensions"):
        fp.dense_attention(q, fp.PagedKV(k, v, [[0]], [1]))


def test_k_and_v_must_match(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="must match"):
        fp.dense_attention(q, k, v[:-1])
    with pytest.raises(ValueError, match="head dimension"):
        fp.dense_attention(q[:, :, :16], k, v)


def test_dtypes(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="float64"):
        fp.dense_attention(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="differs from q"):
        fp.dense_attention(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match="integers"):
        fp.dense_attention(q, k, v, cu_seqlens_q=np.array([0.0, 256.0]))
    with pytest.raises(TypeError, match="numpy.ndarray or a torch.Tensor"):
        fp.dense_attention(q.tolist(), k, v)


def test_argument_combinations(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="cu_seqlens_k is required"):
        fp.dense_attention(q, k, v, cu_seqlens_q=[0, 100, 256])
    with pytest.raises(ValueError, match="both are"):
        fp.dense_attention(q, k, v, cu_seqlens_q=[0, 100, 256], cu_seqlens_k=[0, 256])
    with pytest.raises(TypeError, match="v is required"):
        fp.dense_attention(q, k)
    paged = fp.PagedKV(k.reshape(4, 64, 2, 32), v.reshape(4, 64, 2, 32), [[0, 1, 2, 3]], [256])
    with pytest.raises(ValueError, match="v must be left out"):
        fp.dense_attention(q, paged, v)
    with pytest.raises(ValueError, match="page_table"):
        fp.dense_attention(q, fp.PagedKV(paged.k_cache, paged.v_cache, [0, 1, 2, 3], [256]))
    with pytest.raises(TypeError, match="Index"):
        fp.sparse_attention(q, k, v)


def test_out_must_fit(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="out"):
        fp.dense_attention(q, k, v, out=np.empty((256, 4, 32), dtype=np.float16))
    read_only = np.empty_like(q)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fp.dense_attention(q, k, v, out=read_only)


def test_index_buffers_must_fit(qkv):
    q, k, v = qkv
    index = fp.build_index(q, k, v)
    with pytest.raises(ValueError, match="index.cu"):
        fp.sparse_attention(q, k, v, fp.Index(index.cu[:-1], index.idx, index.k_mean,
                                              index.v_mean, index.config))
    with pytest.raises(ValueError, match="index.k_mean"):
        fp.sparse_attention(q, k, v, fp.Index(index.cu, index.idx, index.k_mean[:, :, :-1],
                                              index.v_mean, index.config))
    with pytest.raises(ValueError, match="index.idx"):
        fp.sparse_attention(q, k, v, fp.Index(index.cu, index.idx.astype(np.int64),
                                              index.k_mean, index.v_mean, index.config))
    missing_v_mean = fp.Index(index.cu, index.idx, index.k_mean, None, index.config)
    raises_library_error(INVALID, fp.sparse_attention, q, k, v, missing_v_mean)


@pytest.mark.parametrize("tuning", [fp.AttentionTuning(num_splits=-1),
                                    fp.AttentionTuning(num_splits=fp.MAX_SPLITS + 1),
                                    fp.AttentionTuning(head_section=-1),
                                    fp.AttentionTuning(head_section=3),  # Hkv = 2
                                    fp.AttentionTuning(lead_tiles=-1)])
def test_bad_tuning(qkv, tuning):
    for call in (fp.prefill, fp.dense_attention):
        error = raises_library_error(INVALID, call, *qkv, tuning=tuning)
        assert "tuning." in error.message


def test_tuning_must_be_an_attention_tuning(qkv):
    with pytest.raises(TypeError, match="AttentionTuning"):
        fp.prefill(*qkv, tuning={"num_splits": 1})
    with pytest.raises(ValueError, match="num_splits"):
        fp.dense_attention(*qkv, tuning=fp.AttentionTuning(num_splits=2**31))
