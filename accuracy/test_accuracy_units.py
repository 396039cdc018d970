"""Fast unit tests of the accuracy harness with numpy only (no model, no torch): the numpy model
of the contract against exact attention and the library, the prompts and the paired interval
(test_accuracy_torch.py has the torch selection rules and the breakdown).

    python3 -m pytest -q accuracy/test_accuracy_units.py
"""

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report                                                        # noqa: E402
import sparse_reference                                              # noqa: E402
import tasks                                                         # noqa: E402


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


SMALL = dict(sink_tokens=64, window_tokens=128)    # forced blocks that leave the threshold work


def structured_problem(L=1024, hq=9, hkv=3, d=64, seed=0):
    """Random q/k/v with some block structure (so that selection has something to choose)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, hq, d), dtype=np.float32) * 2.0
    k = rng.standard_normal((L, hkv, d), dtype=np.float32)
    v = rng.standard_normal((L, hkv, d), dtype=np.float32)
    k[:, :, :8] += 3.0 * np.sin(np.arange(L) / 200.0)[:, None, None]
    return q, k, v


def library():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    try:
        import flashprefill as fp
        fp.prefill                                                   # noqa: B018
    except (ImportError, OSError, AttributeError):
        pytest.skip("flashprefill library not built")
    return fp


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


def test_reference_matches_library():
    fp = library()
    rng = np.random.default_rng(3)
    q = rng.standard_normal((900, 6, 64)).astype(np.float32)
    k = rng.standard_normal((900, 2, 64)).astype(np.float32)
    v = rng.standard_normal((900, 2, 64)).astype(np.float32)
    for correction in (True, False):
        kw = dict(alpha=0.9, block_size=64, sink_tokens=64, window_tokens=128,
                  mean_correction=correction, return_stats=True)
        ref, ref_stats = sparse_reference.prefill(q, k, v, **kw)
        lib, lib_stats = fp.prefill(q, k, v, **kw)
        assert lib_stats["density"] == pytest.approx(ref_stats["density"])
        np.testing.assert_allclose(lib, ref, atol=1e-4)


class CharTokenizer:
    """One token per character: enough to check the prompts' layout."""

    @staticmethod
    def encode(text):
        return [ord(c) for c in text]

    @staticmethod
    def decode(ids):
        return "".join(chr(i) for i in ids)


def haystack(n=40000):
    words = ("and the lord said unto moses. go forth; behold the land: ").split(" ")
    text = " ".join(words[i % len(words)] for i in range(n // 5))
    return np.asarray(CharTokenizer.encode(text[:n]), np.int64)


def test_needle_prompts_have_their_needles_at_their_depths():
    hay = haystack()
    ends = np.zeros(0x110000, bool)
    ends[[ord("."), ord(";"), ord(":")]] = True
    seen = set()
    for i in range(27):
        p = tasks.needle_prompt(CharTokenizer.encode, hay, 8192, i, ends)
        text = CharTokenizer.decode(p.tokens)
        assert len(p.tokens) == 8192 and text.startswith(tasks.PREFIX)
        seen.add((p.kind, p.depth))
        n = tasks.NEEDLES[p.kind]
        assert text.count("One of the special magic numbers for") == n
        for value in p.answers:
            assert text.count(f"is: {value}.") == 1
        at = text.index(f"is: {p.answers[0]}.") / len(text)
        assert abs(at - p.depth) < 0.06
        assert p.eval_rows.max() + 1 < text.rindex("\nWhat")
        assert tasks.needle_correct(p.kind, " " + ", ".join(p.answers) + ".", p.answers)
    assert seen == {(k, d) for k in tasks.KINDS for d in tasks.DEPTHS}


def test_needle_correct_is_exact_match():
    assert tasks.needle_correct("single", " 1234567.", ("1234567",))
    assert not tasks.needle_correct("single", " 1234568, 1234567", ("1234567",))
    assert not tasks.needle_correct("multikey", " none", ("1234567",))
    assert tasks.needle_correct("multivalue", " 4, 3, 2 and 1", ("1", "2", "3", "4"))
    assert not tasks.needle_correct("multivalue", " 4, 3, 2", ("1", "2", "3", "4"))


def test_pack_round_trip(tmp_path):
    corpora = {"kjv": haystack(), "code": haystack(30000)[::-1].copy()}
    path = tmp_path / "p.npz"
    tasks.build_pack(str(path), CharTokenizer.encode, corpora, [2048, 4096], needles=5, windows=2)
    prompts = tasks.load_pack(str(path))
    assert len(prompts) == 2 * (5 + 2 * 2)
    again = tasks.needle_prompt(CharTokenizer.encode, corpora["kjv"], 4096, 3)
    got = next(p for p in prompts if p.name == again.name and len(p.tokens) == 4096)
    np.testing.assert_array_equal(got.tokens, again.tokens)
    assert got.answers == again.answers and got.kind == again.kind
    picked = tasks.select(prompts, 2048, needles=3, windows=1)
    assert [p.kind for p in picked] == ["single", "multikey", "multivalue", "text", "text"]


def test_paired_interval():
    rng = np.random.default_rng(0)
    dense = rng.random(200) < 0.6
    diff, lo, hi = report.paired_difference(dense, dense)
    assert diff == 0 and lo < 0 < hi and hi - lo < 0.04
    worse = dense.copy()
    worse[np.flatnonzero(dense)[:30]] = False                        # 30 needles lost
    diff, lo, hi = report.paired_difference(worse, dense)
    assert diff == pytest.approx(-0.15) and lo < -0.15 < hi < 0
    # independent outcomes: about as wide as the unpaired Wald interval
    other = rng.random(200) < 0.6
    diff, lo, hi = report.paired_difference(other, dense)
    assert 0.15 < hi - lo < 0.22


def test_precision_table_pools_each_precision_against_the_same_dense():
    def record(prompt, kind, config, **kw):
        return {"length": 2048, "prompt": prompt, "kind": kind, "config": config,
                "device": "cpu (float32)", **kw}

    fp = dict(backend="fp", alpha=0.1, block_size=128, mean_correction=True, density=0.7)
    records = [record("n", "single", "dense", backend="dense", correct=True),
               record("t", "text", "dense", backend="dense", correct=None)]
    for dtype, hits, kl, answered in ((None, 90, 0.02, True), ("float8_e4m3", 80, 0.05, False)):
        attn = {} if dtype is None else {"attn_dtype": dtype}
        records += [record("t", "text", "c", n=100, top1_hits=hits, kl_mean=kl, correct=None,
                           **fp, **attn),
                    record("n", "single", "c", n=50, top1_hits=hits // 2, kl_mean=2 * kl,
                           correct=answered, **fp, **attn)]
    rows = report.precision_table(records).splitlines()[2:]
    assert rows == [
        "| 2048 | 0.1 | on | float32 | 2 | 0.700 | 90.00 % | 2.00e-02 | 90.00 % | 4.00e-02 | "
        "1 / 1 (1) |",
        "| 2048 | 0.1 | on | float8_e4m3 | 2 | 0.700 | 80.00 % | 5.00e-02 | 80.00 % | 1.00e-01 | "
        "0 / 1 (1) |"]


def test_sparse_config_names_its_kv_precision():
    import hf_model
    plain = hf_model.SparseConfig(alpha=0.1)
    kv8 = hf_model.SparseConfig(alpha=0.1, dtype="bfloat16", kv_dtype="float8_e4m3")
    assert plain.label == "a0.1-bs128-corr" and plain.attn_dtype("float32") == "float32"
    assert kv8.label == "a0.1-bs128-corr-bf16-kvfp8"
    assert kv8.attn_dtype("float32") == "bfloat16 q, float8_e4m3 kv"
    # the selection arguments are prefill's alone; the backend gets both precisions
    assert "kv_dtype" not in kv8.selection() and "dtype" not in kv8.selection()
    assert kv8.kwargs()["kv_dtype"] == "float8_e4m3"
    with pytest.raises(ValueError, match="kv_dtype"):
        hf_model.register_variant("paper", kv8)
