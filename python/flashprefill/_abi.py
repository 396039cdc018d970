"""Mirrors of include/flashprefill/flashprefill.h's macros, enums and structs, field for field.

Pure ctypes declarations that load nothing, so that tools (the benchmarks) can share them
without importing the package; _lib.py loads the library and declares the prototypes.
"""

import ctypes
import enum

# Mirrors of the header's macros.
VERSION = (0, 3, 0)
TILE_ROWS = 128   # FP_TILE_ROWS: packed rows of a PackGQA query tile
KV_TILE = 64      # FP_KV_TILE: tokens of a physical KV tile
MAX_SPLITS = 16   # FP_MAX_SPLITS: the most KV splits fp_attention_tuning.num_splits may ask for
FLAG_VALIDATE_DEVICE_METADATA = 1
FLAG_MEANS_POOLED = 2

class Status(enum.IntEnum):
    """fp_status."""
    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    WORKSPACE_TOO_SMALL = 3
    CUDA = 4
    INTERNAL = 5


class DType(enum.IntEnum):
    """fp_dtype."""
    FLOAT32 = 0
    BFLOAT16 = 1
    FLOAT16 = 2
    FLOAT8_E4M3 = 3


class Device(enum.IntEnum):
    """fp_device."""
    CPU = 0
    CUDA = 1


class KvLayout(enum.IntEnum):
    """fp_kv_layout."""
    CONTIGUOUS = 0
    PAGED = 1


_c_enum = ctypes.c_int


class AttentionTuning(ctypes.Structure):
    """fp_attention_tuning."""
    _fields_ = [
        ("num_splits", ctypes.c_int32),
        ("head_section", ctypes.c_int32),
        ("lead_tiles", ctypes.c_int32),
    ]


class Problem(ctypes.Structure):
    """fp_problem."""
    _fields_ = [
        ("device", _c_enum),
        ("stream", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("dtype", _c_enum),
        ("batch_size", ctypes.c_int32),
        ("num_heads_q", ctypes.c_int32),
        ("num_heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("q", ctypes.c_void_p),
        ("q_stride_token", ctypes.c_int64),
        ("q_stride_head", ctypes.c_int64),
        ("total_q", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("max_seqlen_q", ctypes.c_int32),
        ("kv_layout", _c_enum),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("k_stride_page", ctypes.c_int64),
        ("k_stride_token", ctypes.c_int64),
        ("k_stride_head", ctypes.c_int64),
        ("v_stride_page", ctypes.c_int64),
        ("v_stride_token", ctypes.c_int64),
        ("v_stride_head", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int32),
        ("total_k", ctypes.c_int64),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("num_pages", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("page_table", ctypes.c_void_p),
        ("max_pages_per_seq", ctypes.c_int32),
        ("seqlens_k", ctypes.c_void_p),
        # FP8 e4m3, appended (the fields above keep their offsets).
        ("kv_dtype", _c_enum),
        ("out_dtype", _c_enum),
        ("q_descale", ctypes.c_void_p),
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("q_descale_stride_batch", ctypes.c_int64),
        ("q_descale_stride_head", ctypes.c_int64),
        ("k_descale_stride_batch", ctypes.c_int64),
        ("k_descale_stride_head", ctypes.c_int64),
        ("v_descale_stride_batch", ctypes.c_int64),
        ("v_descale_stride_head", ctypes.c_int64),
        # Attention tuning, appended likewise.
        ("tuning", AttentionTuning),
    ]


class SelectConfig(ctypes.Structure):
    """fp_select_config."""
    _fields_ = [
        ("block_size", ctypes.c_int32),
        ("alpha", ctypes.c_float),
        ("sink_tokens", ctypes.c_int32),
        ("window_tokens", ctypes.c_int32),
        ("dense_recent_tiles", ctypes.c_int32),
        ("mean_correction", ctypes.c_int32),
    ]


class Index(ctypes.Structure):
    """fp_index."""
    _fields_ = [
        ("cu", ctypes.c_void_p),
        ("idx", ctypes.c_void_p),
        ("k_mean", ctypes.c_void_p),
        ("v_mean", ctypes.c_void_p),
        ("idx_capacity", ctypes.c_int64),
    ]


class IndexSizes(ctypes.Structure):
    """fp_index_sizes."""
    _fields_ = [
        ("num_segments", ctypes.c_int64),
        ("max_q_tiles", ctypes.c_int32),
        ("max_blocks", ctypes.c_int32),
        ("idx_capacity", ctypes.c_int64),
        ("mean_elements", ctypes.c_int64),
    ]


class Output(ctypes.Structure):
    """fp_output."""
    _fields_ = [
        ("out", ctypes.c_void_p),
        ("out_stride_token", ctypes.c_int64),
        ("out_stride_head", ctypes.c_int64),
        ("lse", ctypes.c_void_p),
    ]
