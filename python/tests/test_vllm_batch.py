"""flashprefill.vllm.batch (the vLLM backend's translation to library calls, no vLLM needed):
one forward's batch as vLLM's runner hands it over (decodes first, then prefill, extend and
prefix-cache-hit requests; block size 16; shuffled pool blocks in FLASH_ATTN's cache layout)
gives, row for row, the library's contiguous call and exact attention. CPU tensors always;
CUDA tensors (bfloat16) when torch sees a GPU and the library has its CUDA path."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, reference_attention, structured_qkv
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


class Forward:
    """A batch's tensors: contiguous q, k, v per request (the truth) and the paged cache
    vLLM would hold, filled through write_kv."""

    def __init__(self, rng, requests, device, dtype, spare_blocks=5):
        lens_q = [lq for lq, _ in requests]
        lens_kv = [lk for _, lk in requests]
        q, k, v = structured_qkv(rng, sum(lens_q), sum(lens_kv), HQ, HKV, D)
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
        # FLASH_ATTN's per-layer cache: logical [num_blocks, Hkv, block, 2D], stored
        # [num_blocks, block, Hkv, 2D]; unused slots hold NaN so a wrong read shows.
        storage = torch.full((num_blocks, BLOCK, HKV, 2 * D), float("nan"), dtype=dtype,
                             device=device)
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
                    self.key_cache, self.value_cache, torch.cat([slot_mapping[:half], pad]))
        vb.write_kv(k_t[half:], v_t[half:], self.key_cache, self.value_cache,
                    slot_mapping[half:])
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
        batch.run(self.q, self.key_cache, self.value_cache, out, 1.0 / np.sqrt(D))
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
        out = fn(t(q), t(k), t(v), cu_seqlens_q=torch.from_numpy(cu_q).to(self.device),
                 cu_seqlens_k=torch.from_numpy(cu_k).to(self.device), **kwargs)
        out = out.float().cpu().numpy()
        return {r: out[cu_q[i]:cu_q[i + 1]] for i, r in enumerate(requests)}

    def exact(self):
        out, _ = reference_attention(self.q_np, self.k_np, self.v_np, cu_of(self.lens_q),
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


def test_settings_from_env():
    s = vb.Settings.from_env({"FLASHPREFILL_ALPHA": "0.25", "FLASHPREFILL_MIN_SPARSE_LEN": "64",
                              "FLASHPREFILL_MEAN_CORRECTION": "off", "FLASHPREFILL_VLLM_CPU": "1",
                              "FLASHPREFILL_SINK_TOKENS": ""})
    assert s == vb.Settings(alpha=0.25, min_sparse_len=64, mean_correction=False, cpu=True)
    assert vb.Settings.from_env({}) == vb.Settings()
    assert not vb.Settings.from_env({}).cpu
    with pytest.raises(ValueError, match="FLASHPREFILL_ALPHA='x'"):
        vb.Settings.from_env({"FLASHPREFILL_ALPHA": "x"})
    with pytest.raises(ValueError, match="FLASHPREFILL_VLLM_CPU='maybe'"):
        vb.Settings.from_env({"FLASHPREFILL_VLLM_CPU": "maybe"})
    with pytest.raises(ValueError, match=r"FLASHPREFILL_ALPHA='2': alpha must lie in \[0, 1\]"):
        vb.Settings.from_env({"FLASHPREFILL_ALPHA": "2"})
    with pytest.raises(ValueError, match="multiple of 64"):
        vb.Settings(block_size=100)


def test_consecutive_span_share():
    table = np.array([[4, 5, 6, 7, 8, 9, 10, 11, 3, 2, 1, 0, 12, 13, 14, 15, 99],
                      [20, 21, 22, 23, 24, 25, 26, 27, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    # request 0: spans [0, 128) consecutive, [128, 256) not; the partial tail is not a span
    # request 1: 128 keys, one consecutive span
    assert vb.consecutive_span_share(table, [260, 128], 16) == (1 + 1, 2 + 1)
    assert vb.consecutive_span_share(table, [260, 128], 128) == (3, 3)  # one block per span
