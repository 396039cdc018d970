"""flashprefill.vllm.batch (the vLLM backend's translation to library calls, no vLLM needed):
one forward's batch as vLLM's runner hands it over (decodes first, then prefill, extend and
prefix-cache-hit requests; block size 16; shuffled pool blocks in FLASH_ATTN's cache layout)
gives, row for row, the library's contiguous call and exact attention. CPU tensors always;
CUDA tensors (bfloat16) when torch sees a GPU and the library has its CUDA path."""

import dataclasses
import types

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, reference_attention, rel_l2, structured_qkv
from flashprefill.vllm import batch as vb

torch = pytest.importorskip("torch")

PLACES = [pytest.param("cpu", id="cpu"),
          pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
              not (torch.cuda.is_available() and fp.cuda_available()),
              reason="needs torch with a GPU and the library's CUDA path"))]

BLOCK = 16
HQ, HKV, D = 4, 2, 64
SETTINGS = vb.Settings(alpha=0.3, sink_tokens=64, window_tokens=128, min_sparse_len=512)

# (new tokens, keys) per request: two decodes, a whole prompt, a short prompt (dense), a chunk
# after 900 cached keys, a prefix-cache hit of 512 keys.
MIXED = [(1, 300), (1, 517), (700, 700), (150, 150), (260, 1160), (300, 812)]
ALL_LONG = [(640, 640), (333, 1100)]


def quantize(x, scale):
    """round_e4m3(x / scale), saturating: what vLLM's cache update stores in an FP8 cache."""
    return (x.to(torch.float32) / scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def cache_storage(num_blocks, device, dtype, fp8_scales):
    """(storage [num_blocks, block, Hkv, 2D], scales): FLASH_ATTN's per-layer cache as vLLM
    stores it (its logical shape [num_blocks, Hkv, block, 2D] is storage.transpose(1, 2)),
    unused slots NaN so that a wrong read shows; with fp8_scales (k_scale, v_scale) vLLM's
    uint8 FP8 cache (0x7f is e4m3's NaN) and {"k_scale", "v_scale"} as float32 tensors, else
    {}."""
    shape = (num_blocks, BLOCK, HKV, 2 * D)
    if fp8_scales is None:
        return torch.full(shape, float("nan"), dtype=dtype, device=device), {}
    scales = {name: torch.tensor(s, dtype=torch.float32, device=device)
              for name, s in zip(("k_scale", "v_scale"), fp8_scales)}
    return torch.full(shape, 0x7F, dtype=torch.uint8, device=device), scales


class Forward:
    """A batch's tensors: contiguous q, k, v per request (the truth) and the paged cache
    vLLM would hold, filled through write_kv. With fp8_scales (k_scale, v_scale): vLLM's FP8
    cache (uint8 storage), and the truth's k and v are its dequantized values."""

    def __init__(self, rng, requests, device, dtype, spare_blocks=5, fp8_scales=None):
        lens_q = [lq for lq, _ in requests]
        lens_kv = [lk for _, lk in requests]
        q, k, v = structured_qkv(rng, sum(lens_q), sum(lens_kv), HQ, HKV, D)
        # the truth is the inputs as the library reads them: rounded to the cache's dtype
        q, k, v = (torch.from_numpy(a).to(dtype).to(torch.float32).numpy() for a in (q, k, v))
        self.q_np, self.k_np, self.v_np = q, k, v
        self.lens_q, self.lens_kv = lens_q, lens_kv
        self.dtype, self.device = dtype, device
        blocks_per = [-(-n // BLOCK) for n in lens_kv]
        num_blocks = sum(blocks_per) + spare_blocks
        order = rng.permutation(num_blocks)
        width = max(blocks_per) + 3
        table = np.zeros((len(requests), width), dtype=np.int32)
        slots = []
        used = 0
        for r, n in enumerate(blocks_per):
            table[r, :n] = order[used:used + n]
            used += n
            positions = np.arange(lens_kv[r])
            slots.append(table[r, positions // BLOCK] * BLOCK + positions % BLOCK)
        storage, self.scales = cache_storage(num_blocks, device, dtype, fp8_scales)
        self.kv_cache = storage.transpose(1, 2)
        self.key_cache, self.value_cache = vb.kv_views(self.kv_cache, D)
        t = lambda a: torch.from_numpy(a).to(device=device, dtype=dtype)
        slot_mapping = torch.from_numpy(np.concatenate(slots)).to(device)
        # The cached prefix and the new tokens both arrive through write_kv (in two calls, as
        # an earlier forward and this one would write them), plus padding slots of -1.
        half = len(slot_mapping) // 2
        pad = torch.full((3,), -1, dtype=slot_mapping.dtype, device=device)
        zeros = torch.zeros((3, HKV, D), dtype=dtype, device=device)
        k_t, v_t = t(k), t(v)
        vb.write_kv(torch.cat([k_t[:half], zeros]), torch.cat([v_t[:half], zeros]),
                    self.key_cache, self.value_cache, torch.cat([slot_mapping[:half], pad]),
                    **self.scales)
        vb.write_kv(k_t[half:], v_t[half:], self.key_cache, self.value_cache,
                    slot_mapping[half:], **self.scales)
        if self.scales:
            self.k8, self.v8 = (quantize(x, self.scales[name]) for x, name in
                                ((k_t, "k_scale"), (v_t, "v_scale")))
            self.k_np = (self.k8.float() * self.scales["k_scale"]).cpu().numpy()
            self.v_np = (self.v8.float() * self.scales["v_scale"]).cpu().numpy()
        self.block_table = torch.from_numpy(table).to(device)
        self.query_start_loc = torch.from_numpy(cu_of(lens_q)).to(device)
        self.seq_lens = torch.tensor(lens_kv, dtype=torch.int32, device=device)
        # q as it reaches the layer: the new tokens of every request, then padding rows.
        self.q = torch.cat([t(q), torch.zeros((4, HQ, D), dtype=dtype, device=device)])

    def batch(self, settings=SETTINGS, include_decodes=False):
        return vb.ForwardBatch(settings, self.query_start_loc, self.seq_lens, self.block_table,
                               query_start_loc_cpu=self.query_start_loc.cpu(),
                               seq_lens_cpu=self.seq_lens.cpu(),
                               include_decodes=include_decodes,
                               num_actual_tokens=sum(self.lens_q))

    def run(self, batch):
        out = torch.full_like(self.q, 7.0)
        batch.run(self.q, self.key_cache, self.value_cache, out, 1.0 / np.sqrt(D),
                  **self.scales)
        return out.float().cpu().numpy()

    def rows(self, r):
        start = sum(self.lens_q[:r])
        return slice(start, start + self.lens_q[r])

    def contiguous(self, requests, fn, **kwargs):
        """fn (the library's contiguous call) on the given requests only: {r: rows}."""
        t = lambda a: torch.from_numpy(a).to(device=self.device, dtype=self.dtype)
        cu_k_all = cu_of(self.lens_kv)
        q = np.concatenate([self.q_np[self.rows(r)] for r in requests])
        k = np.concatenate([self.k_np[cu_k_all[r]:cu_k_all[r + 1]] for r in requests])
        v = np.concatenate([self.v_np[cu_k_all[r]:cu_k_all[r + 1]] for r in requests])
        cu_q = cu_of([self.lens_q[r] for r in requests])
        cu_k = cu_of([self.lens_kv[r] for r in requests])
        k, v = t(k), t(v)
        if self.scales:  # the e4m3 codes and their descales
            k, v = (torch.cat([x[cu_k_all[r]:cu_k_all[r + 1]] for r in requests])
                    for x in (self.k8, self.v8))
            kwargs = dict(kwargs, k_descale=self.scales["k_scale"],
                          v_descale=self.scales["v_scale"])
        out = fn(t(q), k, v, cu_seqlens_q=torch.from_numpy(cu_q).to(self.device),
                 cu_seqlens_k=torch.from_numpy(cu_k).to(self.device), **kwargs)
        out = out.float().cpu().numpy()
        return {r: out[cu_q[i]:cu_q[i + 1]] for i, r in enumerate(requests)}

    def exact(self):
        """float64 attention on the truth; over an FP8 cache with q as the library quantizes
        it (c_q = max|q| / 448 over each request's rows of a KV head's query heads)."""
        q = self.q_np
        if self.scales:
            q = q.copy()
            group = HQ // HKV
            for r in range(len(self.lens_q)):
                for h in range(HKV):
                    x = torch.from_numpy(q[self.rows(r), h * group:(h + 1) * group])
                    c = x.abs().max() / 448  # round_e4m3(q * (1 / c_q)), then dequantized
                    q8 = (x * (1 / c)).clamp(-448, 448).to(torch.float8_e4m3fn)
                    q[self.rows(r), h * group:(h + 1) * group] = (q8.float() * c).numpy()
        out, _ = reference_attention(q, self.k_np, self.v_np, cu_of(self.lens_q),
                                     cu_of(self.lens_kv))
        return out


def tolerance(device):
    """float32 on the CPU (the sparse path accumulates in float32), bfloat16 on CUDA."""
    return dict(rtol=0, atol=1e-4) if device == "cpu" else dict(rtol=0, atol=3e-2)


def sparse_kwargs(settings):
    c = settings.select_config()
    return dict(block_size=c.block_size, alpha=c.alpha, sink_tokens=c.sink_tokens,
                window_tokens=c.window_tokens, dense_recent_tiles=c.dense_recent_tiles,
                mean_correction=c.mean_correction)


def dtype_of(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


@pytest.mark.parametrize("device", PLACES)
@pytest.mark.parametrize("include_decodes", [False, True])
def test_mixed_batch_matches_contiguous_and_exact(rng, device, include_decodes):
    f = Forward(rng, MIXED, device, dtype_of(device))
    batch = f.batch(include_decodes=include_decodes)
    assert batch.num_decodes == 2 and batch.num_decode_tokens == 2
    # Requests 2, 4, 5 are long enough for the sparse path, 3 is not: neither part is
    # consecutive when the decodes join the dense one.
    parts = {p.dense: list(p.requests) for p in batch.parts}
    assert parts[False] == [2, 4, 5]
    assert parts[True] == ([0, 1, 3] if include_decodes else [3])
    out = f.run(batch)
    exact = f.exact()
    tol = tolerance(device)
    sparse = f.contiguous([2, 4, 5], fp.prefill, **sparse_kwargs(SETTINGS))
    for r in (2, 4, 5):
        np.testing.assert_allclose(out[f.rows(r)], sparse[r], **tol)
    # The selection is active: the sparse rows are farther from exact attention than from the
    # contiguous call by an order of magnitude (bf16's tolerance would hide it on CUDA).
    off_exact = np.abs(out[f.rows(4)] - exact[f.rows(4)]).max()
    off_contiguous = np.abs(out[f.rows(4)] - sparse[4]).max()
    assert off_exact > 10 * max(off_contiguous, 1e-3)
    for r in [3] + ([0, 1] if include_decodes else []):
        np.testing.assert_allclose(out[f.rows(r)], exact[f.rows(r)], **tol)
    if not include_decodes:
        np.testing.assert_array_equal(out[:2], 7.0)  # left to vLLM's decode kernel
    np.testing.assert_array_equal(out[sum(f.lens_q):], 7.0)  # padding rows untouched


@pytest.mark.parametrize("device", PLACES)
def test_alpha_zero_is_exact(rng, device):
    f = Forward(rng, MIXED, device, dtype_of(device))
    settings = vb.Settings(alpha=0.0, min_sparse_len=0)
    batch = f.batch(settings, include_decodes=True)
    assert [p.dense for p in batch.parts] == [False, True]
    np.testing.assert_allclose(f.run(batch)[:sum(f.lens_q)], f.exact(), **tolerance(device))


@pytest.mark.parametrize("device", PLACES)
def test_consecutive_requests_use_row_views(rng, device):
    f = Forward(rng, ALL_LONG, device, dtype_of(device))
    batch = f.batch()
    assert len(batch.parts) == 1 and batch.parts[0].rows == slice(0, sum(f.lens_q))
    sparse = f.contiguous([0, 1], fp.prefill, **sparse_kwargs(SETTINGS))
    out = f.run(batch)
    for r in (0, 1):
        np.testing.assert_allclose(out[f.rows(r)], sparse[r], **tolerance(device))


def test_plan_is_built_once_per_forward(rng):
    f = Forward(rng, ALL_LONG, "cpu", torch.float32)
    batch = f.batch()
    first = f.run(batch)
    plans = dict(batch.parts[0]._plans)
    second = f.run(batch)  # another layer of the same forward
    assert batch.parts[0]._plans == plans and len(plans) == 1
    np.testing.assert_array_equal(first, second)


def test_decode_only_batch_has_no_library_work(rng):
    f = Forward(rng, [(1, 40), (1, 90)], "cpu", torch.float32)
    assert f.batch().parts == []
    np.testing.assert_allclose(f.run(f.batch(include_decodes=True))[:2], f.exact(),
                               **tolerance("cpu"))


def test_write_kv_fills_the_slots(rng):
    f = Forward(rng, [(50, 50)], "cpu", torch.float32)
    table = f.block_table.numpy()
    for j in (0, 15, 16, 49):
        block, row = table[0, j // BLOCK], j % BLOCK
        np.testing.assert_array_equal(f.key_cache[block, row].numpy(), f.k_np[j])
        np.testing.assert_array_equal(f.value_cache[block, row].numpy(), f.v_np[j])
        # keys are the first D channels of the slot, values the last D
        np.testing.assert_array_equal(f.kv_cache[block, :, row, :D].numpy(), f.k_np[j])


def test_kv_views_checks_the_shape():
    with pytest.raises(ValueError, match="2 \\* 64"):
        vb.kv_views(torch.zeros(4, 2, 16, 64), 64)


# FP8 KV caches (kv_cache_dtype "fp8"): vLLM's uint8 cache, k_scale / v_scale as descales, a
# bfloat16 q that the library quantizes. Scales: max |x| / 448 of the inputs would be the
# calibrated ones; these are near that for structured_qkv and saturate a few values.
FP8_SCALES = (0.01, 0.008)
# docs/ALGORITHM.md "FP8 e4m3", Tolerances: the CPU FP8 reference against float64 attention on
# its dequantized inputs (relative L2).
FP8_DEQUANTIZED_TOLERANCE = 3e-2


@pytest.mark.parametrize("include_decodes", [False, True])
def test_fp8_cache_matches_contiguous_and_exact(rng, include_decodes):
    f = Forward(rng, MIXED, "cpu", torch.bfloat16, fp8_scales=FP8_SCALES)
    assert f.key_cache.dtype == torch.float8_e4m3fn and f.kv_cache.dtype == torch.uint8
    assert float(f.k8.float().abs().max()) == 448  # some keys saturate
    batch = f.batch(include_decodes=include_decodes)
    out = f.run(batch)
    # The library's contiguous call on the same e4m3 codes and descales, bit for bit: the
    # sparse part through the prefill, the dense one through exact attention.
    sparse = f.contiguous([2, 4, 5], fp.prefill, **sparse_kwargs(SETTINGS))
    dense = f.contiguous([0, 1, 3] if include_decodes else [3], fp.dense_attention)
    for r, rows in {**sparse, **dense}.items():
        np.testing.assert_array_equal(out[f.rows(r)], rows)
    exact = f.exact()
    for r in dense:
        assert rel_l2(out[f.rows(r)], exact[f.rows(r)]) <= FP8_DEQUANTIZED_TOLERANCE
    if not include_decodes:
        np.testing.assert_array_equal(out[:2], 7.0)
    np.testing.assert_array_equal(out[sum(f.lens_q):], 7.0)
    # alpha = 0: every request is FP8 exact attention.
    whole = f.run(f.batch(vb.Settings(alpha=0.0, min_sparse_len=0), include_decodes=True))
    assert rel_l2(whole[:sum(f.lens_q)], exact) <= FP8_DEQUANTIZED_TOLERANCE


def test_cpu_backend_over_an_fp8_cache(rng):
    """FlashPrefillCPUImpl with kv_cache_dtype "fp8" on vLLM's uint8 cache tensor: its cache
    update and forward take the layer's _k_scale / _v_scale (needs vLLM's backend classes)."""
    backend = pytest.importorskip("flashprefill.vllm.backend")
    f = Forward(rng, MIXED, "cpu", torch.bfloat16, fp8_scales=FP8_SCALES)
    layer = types.SimpleNamespace(_k_scale=f.scales["k_scale"], _v_scale=f.scales["v_scale"],
                                  _q_scale=torch.tensor(1.0))
    impl = backend.FlashPrefillCPUImpl(HQ, D, 1.0 / np.sqrt(D), HKV, kv_cache_dtype="fp8")
    # Its cache update writes what write_kv wrote into f's cache, byte for byte.
    cache = torch.full_like(f.kv_cache.transpose(1, 2), 0x7F).transpose(1, 2)
    table, lens = f.block_table.numpy(), f.lens_kv
    slots = torch.from_numpy(np.concatenate([table[r, np.arange(n) // BLOCK] * BLOCK +
                                             np.arange(n) % BLOCK for r, n in enumerate(lens)]))
    # Keys and values that quantize to f's codes again (e4m3 values times the scale).
    k = (f.k8.float() * FP8_SCALES[0]).to(torch.bfloat16)
    v = (f.v8.float() * FP8_SCALES[1]).to(torch.bfloat16)
    impl.do_kv_cache_update(layer, k, v, cache, slots)
    assert cache.equal(f.kv_cache)
    batch = f.batch(include_decodes=True)
    out = torch.full_like(f.q, 7.0)
    impl.forward(layer, f.q, None, None, cache,
                 backend.FlashPrefillMetadata(sum(f.lens_q), batch), out)
    np.testing.assert_array_equal(out.float().numpy(), f.run(batch))
    # One scale per KV head (kv_cache_scheme strategy attn_head) is refused, never broadcast
    # against the head dimension.
    per_head = types.SimpleNamespace(_k_scale=torch.full((HKV,), FP8_SCALES[0]),
                                     _v_scale=f.scales["v_scale"], _q_scale=torch.tensor(1.0))
    message = rf"layer._k_scale holds {HKV} \(per-head KV cache scales are not supported\)"
    with pytest.raises(NotImplementedError, match=message):
        impl.do_kv_cache_update(per_head, k, v, cache, slots)
    with pytest.raises(NotImplementedError, match=message):
        impl.forward(per_head, f.q, None, None, cache,
                     backend.FlashPrefillMetadata(sum(f.lens_q), batch), out)
    with pytest.raises(NotImplementedError, match="fp8_e5m2 KV cache: the library's FP8 "
                                                  "format is e4m3"):
        backend.FlashPrefillCPUImpl(HQ, D, 0.125, HKV, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(NotImplementedError, match=r"the fp8_inc KV cache \(only auto"):
        backend.FlashPrefillCPUImpl(HQ, D, 0.125, HKV, kv_cache_dtype="fp8_inc")
    # On CUDA vLLM's validation gives the reason, which names the dtype too.
    from vllm.platforms.interface import DeviceCapability
    reasons = backend.FlashPrefillBackend.validate_configuration(
        D, torch.bfloat16, "fp8_e5m2", 16, False, False, False, False, False,
        DeviceCapability(9, 0), "decoder")
    assert any("fp8_e5m2 KV cache: the library's FP8 format is e4m3" in r for r in reasons)
    assert "kv_cache_dtype not supported" not in reasons
    config = lambda cache_dtype, dtype: types.SimpleNamespace(
        cache_config=types.SimpleNamespace(cache_dtype=cache_dtype),
        model_config=types.SimpleNamespace(dtype=dtype))
    with pytest.raises(ValueError, match="fp8 KV cache needs a bfloat16 or float16 model"):
        backend.refuse_fp8_under_float32(config("fp8", torch.float32))
    backend.refuse_fp8_under_float32(config("fp8_e4m3", torch.bfloat16))
    backend.refuse_fp8_under_float32(config("auto", torch.float32))


def test_write_kv_quantizes_an_fp8_cache(rng):
    f = Forward(rng, [(50, 50)], "cpu", torch.bfloat16, fp8_scales=FP8_SCALES)
    table = f.block_table.numpy()
    k = torch.from_numpy(f.k_np)  # dequantized; the cache holds round_e4m3(k / k_scale)
    for j in (0, 15, 16, 49):
        block, row = table[0, j // BLOCK], j % BLOCK
        assert f.key_cache[block, row].view(torch.uint8).equal(f.k8[j].view(torch.uint8))
        assert f.value_cache[block, row].view(torch.uint8).equal(f.v8[j].view(torch.uint8))
        assert f.kv_cache[block, :, row, :D].view(torch.float8_e4m3fn).float().mul(
            FP8_SCALES[0]).equal(k[j])
    # Saturation at the e4m3 range, round to nearest even, and the division by the scale.
    cache = torch.zeros(1, 4, 1, 4, dtype=torch.uint8)
    keys, values = vb.kv_views(cache.transpose(1, 2).repeat(1, 1, 1, 2), 4)
    x = torch.tensor([[[1e4, -1e4, 1.0625, 1.1875]]], dtype=torch.bfloat16)
    vb.write_kv(x, x, keys, values, torch.tensor([2]), k_scale=torch.tensor(1.0),
                v_scale=torch.tensor(0.5))
    assert keys[0, 2, 0].float().tolist() == [448, -448, 1.0, 1.25]
    assert values[0, 2, 0].float().tolist() == [448, -448, 2.0, 2.5]
    with pytest.raises(ValueError, match="k_scale: an FP8 cache needs its scale"):
        vb.write_kv(x, x, keys, values, torch.tensor([2]))


def test_settings_from_env():
    s = vb.Settings.from_env({"FLASHPREFILL_ALPHA": "0.25", "FLASHPREFILL_MIN_SPARSE_LEN": "64",
                              "FLASHPREFILL_MEAN_CORRECTION": "off", "FLASHPREFILL_VLLM_CPU": "1",
                              "FLASHPREFILL_SINK_TOKENS": "", "FLASHPREFILL_KEEP_MEANS": "yes"})
    assert s == vb.Settings(alpha=0.25, min_sparse_len=64, mean_correction=False, cpu=True,
                            keep_means=True)
    assert vb.Settings.from_env({}) == vb.Settings()
    assert not vb.Settings.from_env({}).cpu
    assert not vb.Settings.from_env({}).keep_means
    with pytest.raises(ValueError, match="FLASHPREFILL_KEEP_MEANS='2'"):
        vb.Settings.from_env({"FLASHPREFILL_KEEP_MEANS": "2"})
    with pytest.raises(ValueError, match="FLASHPREFILL_ALPHA='x'"):
        vb.Settings.from_env({"FLASHPREFILL_ALPHA": "x"})
    with pytest.raises(ValueError, match="FLASHPREFILL_VLLM_CPU='maybe'"):
        vb.Settings.from_env({"FLASHPREFILL_VLLM_CPU": "maybe"})
    with pytest.raises(ValueError, match=r"FLASHPREFILL_ALPHA='2': alpha must lie in \[0, 1\]"):
        vb.Settings.from_env({"FLASHPREFILL_ALPHA": "2"})
    with pytest.raises(ValueError, match="multiple of 64"):
        vb.Settings(block_size=100)


def test_kept_means_refuse_a_kv_connector():
    engine = types.SimpleNamespace(kv_transfer_config=object())
    with pytest.raises(ValueError, match="FLASHPREFILL_KEEP_MEANS=1 cannot be used with a KV "
                                         "connector"):
        vb.refuse_kept_means_with_kv_transfer(vb.Settings(keep_means=True), engine)
    vb.refuse_kept_means_with_kv_transfer(vb.Settings(), engine)
    vb.refuse_kept_means_with_kv_transfer(vb.Settings(keep_means=True),
                                          types.SimpleNamespace(kv_transfer_config=None))


def test_consecutive_span_share():
    table = np.array([[4, 5, 6, 7, 8, 9, 10, 11, 3, 2, 1, 0, 12, 13, 14, 15, 99],
                      [20, 21, 22, 23, 24, 25, 26, 27, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    # request 0: spans [0, 128) consecutive, [128, 256) not; the partial tail is not a span
    # request 1: 128 keys, one consecutive span
    assert vb.consecutive_span_share(table, [260, 128], 16) == (1 + 1, 2 + 1)
    assert vb.consecutive_span_share(table, [260, 128], 128) == (3, 3)  # one block per span



# Kept means (Settings.keep_means): forwards of one engine over a persistent pool, each run
# twice on the same cache, through the layer's KeptMeans and pooling every block from scratch.

class Pool:
    """A paged KV pool in FLASH_ATTN's layout (block size 16, blocks handed out shuffled) and
    the KeptMeans of its layer; a forward writes it as vLLM's cache update does (write_kv,
    then KeptMeans.invalidate). With fp8_scales (k_scale, v_scale): an FP8 pool."""

    def __init__(self, rng, num_blocks, device, dtype, settings, fp8_scales=None):
        storage, self.scales = cache_storage(num_blocks, device, dtype, fp8_scales)
        self.key_cache, self.value_cache = vb.kv_views(storage.transpose(1, 2), D)
        self.free = [int(b) for b in rng.permutation(num_blocks)]
        self.kept = vb.KeptMeans(self.key_cache, settings.block_size, settings.mean_correction)
        self.settings, self.device, self.dtype = settings, device, dtype

    def tensor(self, a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=self.device, dtype=self.dtype)

    def forward(self, steps):
        """steps: (Seq, new tokens) pairs. Writes their new keys and values, then returns the
        step's ForwardBatch and q (every request's new rows)."""
        slots = []
        for seq, new in steps:
            while len(seq.blocks) * BLOCK < seq.computed + new:
                seq.blocks.append(self.free.pop())
            positions = np.arange(seq.computed, seq.computed + new)
            slots.append(np.asarray(seq.blocks)[positions // BLOCK] * BLOCK + positions % BLOCK)
        new_rows = lambda a: np.concatenate([getattr(seq, a)[seq.computed:seq.computed + new]
                                             for seq, new in steps])
        q, k, v = (self.tensor(new_rows(a)) for a in "qkv")
        slot_mapping = torch.from_numpy(np.concatenate(slots)).to(self.device)
        vb.write_kv(k, v, self.key_cache, self.value_cache, slot_mapping, **self.scales)
        self.kept.invalidate(slot_mapping)
        for seq, new in steps:
            seq.computed += new
        table = np.zeros((len(steps), max(len(seq.blocks) for seq, _ in steps) + 2), np.int32)
        for r, (seq, _) in enumerate(steps):
            table[r, :len(seq.blocks)] = seq.blocks
        query_start_loc = torch.from_numpy(cu_of([new for _, new in steps])).to(self.device)
        seq_lens = torch.tensor([seq.computed for seq, _ in steps], dtype=torch.int32,
                                device=self.device)
        batch = vb.ForwardBatch(self.settings, query_start_loc, seq_lens,
                                torch.from_numpy(table).to(self.device),
                                query_start_loc_cpu=query_start_loc.cpu(),
                                seq_lens_cpu=seq_lens.cpu())
        return batch, q

    def kept_of(self, batch):
        """(sparse part, (k_mean, v_mean), pooled_keys) as the part's next run would take
        them from the kept means."""
        part = next(p for p in batch.parts if not p.dense)
        rows = part.mean_rows(self.kept, -(-part.max_seqlen_k // self.settings.block_size))
        means, pooled_keys = self.kept.gather(rows)
        return part, means, pooled_keys.cpu().tolist()

    def run_both(self, batch, q):
        """(kept, rebuilt): the forward's rows through the kept means and from scratch."""
        outs = {}
        for kept in (None, self.kept):
            out = torch.full_like(q, 7.0)
            batch.run(q, self.key_cache, self.value_cache, out, 1.0 / np.sqrt(D), kept,
                      **self.scales)
            outs[kept is not None] = out.float().cpu().numpy()
        return outs[True], outs[False]


class Seq:
    """A request: keys, values and queries for all its positions, and its pool blocks; with
    a prefix, a prefix-cache hit on its first prefix_len keys (the same keys, the same
    blocks)."""

    def __init__(self, rng, length, prefix=None, prefix_len=0):
        self.q, self.k, self.v = structured_qkv(rng, length, length, HQ, HKV, D)
        self.blocks, self.computed = [], 0
        if prefix is not None:
            self.k[:prefix_len], self.v[:prefix_len] = prefix.k[:prefix_len], prefix.v[:prefix_len]
            self.blocks = list(prefix.blocks[:prefix_len // BLOCK])
            self.computed = prefix_len


def check_forward(pool, steps, pooled_keys):
    """One forward: the kept means hold `pooled_keys` keys of each sparse request (in the
    part's order), and the output through them is the output of pooling every block."""
    batch, q = pool.forward(steps)
    assert pool.kept_of(batch)[2] == pooled_keys
    kept, rebuilt = pool.run_both(batch, q)
    np.testing.assert_array_equal(kept, rebuilt)
    assert np.isfinite(kept).all()
    return batch, q, kept


def check_selection(pool, batch, seqs):
    """Every sparse request's filled blocks hold their Eq. 5 means (rounded to the cache's
    dtype), and the index built from them, with the partial block pooled, is the index
    built from scratch."""
    part, (k_kept, v_kept), pooled_keys = pool.kept_of(batch)
    config = pool.settings.select_config()
    for i, r in enumerate(part.requests):
        seq = seqs[r]
        q, k, v = (pool.tensor(getattr(seq, a)[:seq.computed]) for a in "qkv")
        q = q[-200:]
        fresh = fp.build_index(q, k, v, config=config)
        blocks, filled = fresh.k_mean.shape[2], seq.computed // config.block_size
        assert pooled_keys[i] == filled * config.block_size
        means = tuple(None if m is None else m[i:i + 1, :, :blocks].contiguous()
                      for m in (k_kept, v_kept))
        for got, want in zip(means, (fresh.k_mean, fresh.v_mean)):
            if want is not None:
                np.testing.assert_array_equal(got[:, :, :filled].cpu().numpy(),
                                              want[:, :, :filled].to(pool.dtype).float().cpu())
        means = fp.pool_kv(q, k, v, config=config, means=means, pooled_keys=[pooled_keys[i]])
        reused = fp.build_index(q, k, v, config=config, means=means)
        np.testing.assert_array_equal(reused.cu.cpu(), fresh.cu.cpu())
        n = int(fresh.cu[-1])
        np.testing.assert_array_equal(reused.idx[:n].cpu(), fresh.idx[:n].cpu())


KEPT_SETTINGS = dataclasses.replace(SETTINGS, keep_means=True)


@pytest.mark.parametrize("device,dtype", [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
    *[pytest.param("cuda", dt, id=f"cuda-{name}", marks=PLACES[1].marks)
      for name, dt in (("bfloat16", torch.bfloat16), ("float16", torch.float16))]])
@pytest.mark.parametrize("mean_correction", [True, False], ids=["corrected", "uncorrected"])
def test_kept_means_equal_pooling_every_block(rng, device, dtype, mean_correction):
    """Chunked prefill, a request that ran dense before, a prefix-cache hit, and preemption
    with block reuse: every forward's output through the kept means is, bit for bit, the
    output of pooling every block, and the kept means hold the right blocks."""
    settings = dataclasses.replace(KEPT_SETTINGS, mean_correction=mean_correction)
    pool = Pool(rng, 400, device, dtype, settings)
    a, b = Seq(rng, 1100), Seq(rng, 1000)
    # 1: A's first chunk runs sparse and pools 4 filled blocks of 128; B's (300 keys) dense.
    check_forward(pool, [(a, 600), (b, 300)], [0])
    # 2: A's next chunk takes its 512 pooled keys; B turns sparse and pools from 0 (its dense
    # chunk kept nothing); C hits A's first 512 keys in the prefix cache and takes their means.
    c = Seq(rng, 1600, prefix=a, prefix_len=512)
    batch, q, out = check_forward(pool, [(a, 500), (b, 400), (c, 400)], [512, 0, 512])
    tol = tolerance(device) if dtype == torch.float32 else dict(rtol=0, atol=3e-2)
    for r, seq in enumerate((a, b, c)):
        rows = slice(int(batch.starts[r]), int(batch.starts[r + 1]))
        k, v = (pool.tensor(getattr(seq, x)[:seq.computed]) for x in "kv")
        want = fp.prefill(q[rows], k, v, **sparse_kwargs(settings))
        np.testing.assert_allclose(out[rows], want.float().cpu().numpy(), **tol)
    # 3: A is preempted: its blocks past the shared prefix return to the pool and D (first in
    # the batch, so it takes them) writes its keys into them in A's order: D's selection
    # blocks end in cache blocks where A's kept means were current. The cache update made
    # them stale: D pools from 0; B and C go on.
    pool.free += a.blocks[512 // BLOCK:][::-1]
    d = Seq(rng, 1000)
    check_forward(pool, [(d, 800), (b, 300), (c, 300)], [0, 640, 896])
    assert d.blocks[:len(a.blocks) - 512 // BLOCK] == a.blocks[512 // BLOCK:]
    batch, _, _ = check_forward(pool, [(c, 300), (d, 200)], [1152, 768])
    check_selection(pool, batch, [c, d])


def test_kept_means_over_an_fp8_cache(rng):
    """The kept means of an FP8 cache are float32 (the means of the dequantized keys, which
    the library rounds only after dividing by the descale), and a run through them is, bit for
    bit, the run that pools every block: chunked prefill and a prefix-cache hit."""
    pool = Pool(rng, 200, "cpu", torch.bfloat16, KEPT_SETTINGS, fp8_scales=FP8_SCALES)
    assert pool.key_cache.dtype == torch.float8_e4m3fn and pool.kept.k.dtype == torch.float32
    a, b = Seq(rng, 1100), Seq(rng, 700)
    check_forward(pool, [(a, 600), (b, 300)], [0])
    c = Seq(rng, 1000, prefix=a, prefix_len=512)
    batch, q, out = check_forward(pool, [(a, 500), (b, 400), (c, 300)], [512, 0, 512])
    rows = slice(int(batch.starts[0]), int(batch.starts[1]))
    k8, v8 = (quantize(pool.tensor(getattr(a, x)), pool.scales[name])
              for x, name in (("k", "k_scale"), ("v", "v_scale")))
    want = fp.prefill(q[rows], k8, v8, k_descale=pool.scales["k_scale"],
                      v_descale=pool.scales["v_scale"], **sparse_kwargs(KEPT_SETTINGS))
    np.testing.assert_array_equal(out[rows], want.float().numpy())


def test_kept_means_entries_per_cache_block(rng):
    """A selection block's mean lives at the cache block of its last key: cache blocks of 256
    keys hold two selection blocks' means each, blocks of 48 or 128 at most one; a write to a
    cache block makes all of its entries stale; padding slots touch only the scratch row."""
    for page, ends in ((256, 2), (48, 1), (128, 1)):
        kept = vb.KeptMeans(torch.zeros(20, page, HKV, D), 128, True)
        assert kept.ends == ends and kept.k.shape == (20 * ends + 1, HKV, D)
        assert kept.v.shape == kept.k.shape
        pages = -(-768 // page)
        table = torch.from_numpy(rng.permutation(20)[:pages].astype(np.int32))[None]
        rows = kept.rows(table, torch.tensor([700]), 6)
        last = np.arange(6) * 128 + 127
        want = table[0, last // page].numpy() * ends + (last % page) // 128
        want[700 // 128:] = kept.scratch  # block 5 (keys 640 .. 767) is not filled
        np.testing.assert_array_equal(rows[0].numpy(), want)
        kept.current[:] = True
        written = int(table[0, 2])
        kept.invalidate(torch.tensor([-1, written * page + 5, -1]))
        stale = list(range(written * ends, (written + 1) * ends))
        assert [i for i in range(kept.scratch) if not kept.current[i]] == stale
        assert not bool(kept.current[kept.scratch])
    assert vb.KeptMeans(torch.zeros(4, 16, HKV, D), 128, False).v is None
