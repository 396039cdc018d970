"""FP8 e4m3 problems (docs/ALGORITHM.md "FP8 e4m3"): the KV and output dtypes and the descale
factors of fp_problem's appended fields.

Descales: None (1; for a bfloat16/float16 q, None means the library's dynamic c_q), a Python
number (one factor for the whole tensor), or a float32 array in q's place: shape () or (1,) for
one factor, or [B, Hkv] (FA3's q_descale / k_descale / v_descale; any strides in elements, 0
broadcasts, as torch's expand() gives).
"""

import math

import numpy as np

from . import _arrays
from ._lib import DType

_NAMES = ("q_descale", "k_descale", "v_descale")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 2^-126


def kv_dtype_code(qa, ka, va):
    """fp_problem.kv_dtype for k and v: 0 (as q's) or their fp_dtype when it differs."""
    for a in (ka, va):
        if a.dtype != qa.dtype and _arrays.fp_dtype(a) != DType.FLOAT8_E4M3:
            raise TypeError(f"{a.name}: dtype {a.dtype} differs from q's {qa.dtype}; q, k and v "
                            f"share one dtype, except bfloat16 or float16 q over an e4m3 KV cache")
    if va.dtype != ka.dtype:
        raise TypeError(f"{va.name}: dtype {va.dtype} differs from {ka.name}'s {ka.dtype}; k and "
                        f"v share one dtype")
    kv_code = _arrays.fp_dtype(ka)
    return DType.FLOAT32 if kv_code == _arrays.fp_dtype(qa) else kv_code


def default_out_dtype(qa):
    """The dtype of a new out: q's, or bfloat16 for an e4m3 q."""
    if _arrays.fp_dtype(qa) != DType.FLOAT8_E4M3:
        return qa.dtype
    if qa.device is None:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return _arrays._torch().bfloat16


def out_dtype_code(oa):
    """fp_problem.out_dtype of an FP8 problem's out: FP_FLOAT32 (0) would mean the default, so
    a float32 out is refused here, as is a dtype the library has no code for; the library
    checks the rest."""
    try:
        code = _arrays.fp_dtype(oa)
    except TypeError:
        raise TypeError(f"{oa.name}: dtype {oa.dtype} is not supported; an FP8 problem writes "
                        f"bfloat16 or float16") from None
    if code == DType.FLOAT32:
        raise ValueError(f"{oa.name}: dtype {oa.dtype}; an FP8 problem writes bfloat16 or "
                         f"float16")
    return code


def empty(like, shape, dtype):
    """An uninitialized contiguous array of `dtype` (numpy or torch dtype) in like's place."""
    if like.device is None:
        return np.empty(shape, dtype=dtype)
    return _arrays._torch().empty(shape, dtype=dtype, device=like.device)


def _descale(value, like, name, shape):
    """(Array or None, stride_batch, stride_head) of one descale argument."""
    if value is None:
        return None, 0, 0
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a number or a float32 array, got the bool {value}")
    if isinstance(value, (int, float, np.floating, np.integer)):
        # A number float32 would turn into 0, a subnormal or inf is refused here, by its own
        # value; 0, negatives, NaN and inf go on for the library to refuse.
        x = float(value)
        if math.isfinite(x) and (abs(x) > _FLOAT32_MAX or 0 < abs(x) < _FLOAT32_TINY):
            raise ValueError(f"{name} = {value!r}: outside the normal float32 range "
                             f"[{_FLOAT32_TINY:g}, {_FLOAT32_MAX:g}] of a descale factor")
        value = np.full((1,), x, dtype=np.float32)
        if like.device is not None:
            value = _arrays._torch().from_numpy(value).to(like.device)
    a = _arrays.Array(value, name)
    _arrays.require_same_place(like, a)
    if str(a.dtype).replace("torch.", "") != "float32":
        raise TypeError(f"{name}: expected float32, got {a.dtype}")
    if a.shape in ((), (1,)):
        return a, 0, 0
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape () or (1,) (one factor) or [B, Hkv] = {shape}, "
                         f"got {a.shape}")
    return a, a.strides[0], a.strides[1]


def set_fields(c, qa, descales, keep):
    """Fills (or, for a None, clears) the descale fields of fp_problem `c` (batch and heads
    already set); `qa` is q's Array (or what stands in for its place), `keep` collects the
    arrays the pointers refer to."""
    shape = (c.batch_size, c.num_heads_kv)
    # All three are checked before any field is written: a refused argument leaves `c` as it was.
    resolved = [_descale(value, qa, name, shape) for name, value in zip(_NAMES, descales)]
    for name, (a, stride_batch, stride_head) in zip(_NAMES, resolved):
        if a is not None:
            keep.append(a)
        setattr(c, name, None if a is None else a.ptr)
        setattr(c, name + "_stride_batch", stride_batch)
        setattr(c, name + "_stride_head", stride_head)
