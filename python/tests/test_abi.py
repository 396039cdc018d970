"""The ctypes mirrors against the header, counted by hand for LP64 (x86-64, aarch64)."""

import ctypes
import os
import subprocess
import sys

import pytest

import flashprefill as fp
from flashprefill import _lib

# (struct, sizeof, {field: offset}); enums are C ints, pointers and int64 are 8-byte aligned.
LAYOUTS = [
    (_lib.Problem, 312, {
        "device": 0, "stream": 8, "flags": 16, "dtype": 20, "batch_size": 24, "num_heads_q": 28,
        "num_heads_kv": 32, "head_dim": 36, "softmax_scale": 40, "q": 48, "q_stride_token": 56,
        "q_stride_head": 64, "total_q": 72, "cu_seqlens_q": 80, "max_seqlen_q": 88,
        "kv_layout": 92, "k": 96, "v": 104, "k_stride_page": 112, "k_stride_token": 120,
        "k_stride_head": 128, "v_stride_page": 136, "v_stride_token": 144, "v_stride_head": 152,
        "max_seqlen_k": 160, "total_k": 168, "cu_seqlens_k": 176, "num_pages": 184,
        "page_size": 188, "page_table": 192, "max_pages_per_seq": 200, "seqlens_k": 208,
        "kv_dtype": 216, "out_dtype": 220, "q_descale": 224, "k_descale": 232, "v_descale": 240,
        "q_descale_stride_batch": 248, "q_descale_stride_head": 256,
        "k_descale_stride_batch": 264, "k_descale_stride_head": 272,
        "v_descale_stride_batch": 280, "v_descale_stride_head": 288, "tuning": 296}),
    (_lib.AttentionTuning, 12, {"num_splits": 0, "head_section": 4, "lead_tiles": 8}),
    (_lib.SelectConfig, 24, {
        "block_size": 0, "alpha": 4, "sink_tokens": 8, "window_tokens": 12,
        "dense_recent_tiles": 16, "mean_correction": 20}),
    (_lib.Index, 40, {"cu": 0, "idx": 8, "k_mean": 16, "v_mean": 24, "idx_capacity": 32}),
    (_lib.IndexSizes, 32, {
        "num_segments": 0, "max_q_tiles": 8, "max_blocks": 12, "idx_capacity": 16,
        "mean_elements": 24}),
    (_lib.Output, 32, {"out": 0, "out_stride_token": 8, "out_stride_head": 16, "lse": 24}),
]


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="layouts counted for LP64")
@pytest.mark.parametrize("struct,size,offsets", LAYOUTS, ids=[s.__name__ for s, _, _ in LAYOUTS])
def test_struct_layout(struct, size, offsets):
    assert ctypes.sizeof(struct) == size
    assert [name for name, _ in struct._fields_] == list(offsets)
    for name, offset in offsets.items():
        assert getattr(struct, name).offset == offset, name


def test_select_config_default_round_trip():
    from_library = fp.SelectConfig.from_c(_lib.default_select_config())
    assert from_library == fp.SelectConfig()
    assert from_library == fp.SelectConfig(block_size=128, alpha=0.1, sink_tokens=256,
                                           window_tokens=512, dense_recent_tiles=1,
                                           mean_correction=True)
    custom = fp.SelectConfig(256, 0.25, 0, 64, 2, False)
    assert fp.SelectConfig.from_c(custom.to_c()) == custom


def test_version_and_constants():
    assert fp.__version__ == "%d.%d.%d" % _lib.VERSION
    assert (fp.TILE_ROWS, fp.KV_TILE) == (128, 64)


def test_status_strings():
    for status in fp.Status:
        assert _lib.status_string(status)


def test_cuda_available_is_bool():
    assert isinstance(fp.cuda_available(), bool)


def test_missing_library_import_error():
    env = dict(os.environ, FLASHPREFILL_LIB="/nonexistent/libflashprefill.so")
    code = "import flashprefill"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.dirname(fp.__file__)))
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "scripts/setup.sh" in result.stderr
    assert "/nonexistent/libflashprefill.so" in result.stderr
