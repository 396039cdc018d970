"""The transformers backend (flashprefill.hf) on a small random Llama: with alpha = 0 every call
is exact attention, so the model's logits must match transformers' own SDPA backend (padded
batches, packed rows and cached decoding included); with the default selection the calls are
sparse. Runs on the CPU (float32) and, where torch sees a GPU and the library has its CUDA
path, on the GPU (bfloat16)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashprefill as fp  # noqa: E402
import flashprefill.hf as fph  # noqa: E402

EXACT = "sparse_prefill_exact_test"
SPARSE = "sparse_prefill_test"
fph.register(EXACT, alpha=0.0)
fph.register(SPARSE, sink_tokens=64, window_tokens=64, block_size=64)
fph.register(EXACT + "_fp8", alpha=0.0, dtype=fph.FP8)
fph.register(EXACT + "_bf16", alpha=0.0, dtype="bfloat16")

PLACES = [pytest.param("cpu", torch.float32, 1e-4, id="cpu-float32")]
if torch.cuda.is_available() and fp.cuda_available():
    PLACES.append(pytest.param("cuda", torch.bfloat16, 3e-2, id="cuda-bfloat16"))


def llama(attn, device, dtype, seed=0):
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = attn  # the same weights under each backend
    return model.to(device=device, dtype=dtype).eval()


def relative(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("device,dtype,tol", PLACES)
def test_exact_backend_matches_sdpa(device, dtype, tol):
    model = llama("sdpa", device, dtype)
    ids = torch.randint(0, 512, (1, 300), device=device)
    want = logits(model, input_ids=ids)
    model.config._attn_implementation = EXACT
    got = logits(model, input_ids=ids)
    assert relative(got, want) < tol


@pytest.mark.parametrize("device,dtype,tol", PLACES)
def test_padded_batch_matches_each_request_alone(device, dtype, tol):
    """Left padding: each row's valid positions give the logits of that request run alone."""
    model = llama(EXACT, device, dtype)
    lengths = [200, 131, 64]
    width = max(lengths)
    ids = torch.randint(1, 512, (len(lengths), width), device=device)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, width - n:] = 1
    batch = logits(model, input_ids=ids, attention_mask=mask)
    for b, n in enumerate(lengths):
        alone = logits(model, input_ids=ids[b:b + 1, width - n:])
        assert relative(batch[b, width - n:], alone[0]) < tol, f"request {b}"


@pytest.mark.parametrize("device,dtype,tol", PLACES)
def test_packed_row_matches_each_request_alone(device, dtype, tol):
    """Two requests packed in one row (position_ids restart): no attention across them."""
    model = llama(EXACT, device, dtype)
    a = torch.randint(0, 512, (1, 90), device=device)
    b = torch.randint(0, 512, (1, 70), device=device)
    positions = torch.cat([torch.arange(90), torch.arange(70)]).to(device)[None]
    packed = logits(model, input_ids=torch.cat([a, b], 1), position_ids=positions)
    assert relative(packed[0, :90], logits(model, input_ids=a)[0]) < tol
    assert relative(packed[0, 90:], logits(model, input_ids=b)[0]) < tol


@pytest.mark.parametrize("device,dtype,tol", PLACES)
def test_packed_rows_of_a_batch_match_each_request_alone(device, dtype, tol):
    """A batch of two rows, each holding two requests (position_ids restart in each row)."""
    model = llama(EXACT, device, dtype)
    ids = torch.randint(0, 512, (2, 100), device=device)
    positions = torch.cat([torch.arange(60), torch.arange(40)]).to(device)[None].expand(2, -1)
    packed = logits(model, input_ids=ids, position_ids=positions, use_cache=False)
    for row in range(2):
        for cut in (slice(0, 60), slice(60, 100)):
            alone = logits(model, input_ids=ids[row:row + 1, cut])[0]
            assert relative(packed[row, cut], alone) < tol


def test_static_caches_and_other_mask_patterns_raise():
    """What the model's mask function says the attention must do, beyond causal attention over
    each request's keys, raises in the backend's mask function: static caches (keys past the
    queries' last position), sliding windows, chunked attention and mask overlays; the causal
    pattern with padding or packed requests passes."""
    from transformers import StaticCache
    from transformers import masking_utils as mu

    model = llama(EXACT, "cpu", torch.float32)
    ids = torch.randint(0, 512, (1, 12))
    with pytest.raises(NotImplementedError, match="not the last positions of the keys"):
        logits(model, input_ids=ids, past_key_values=StaticCache(config=model.config,
                                                                 max_cache_len=32))
    causal = mu.causal_mask_function
    args = dict(batch_size=1, q_length=8, kv_length=8)
    for pattern, what in ((mu.sliding_window_causal_mask_function(4), "sliding-window"),
                          (mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long)),
                           "chunked attention"),
                          (mu.or_masks(causal, lambda b, h, q, k: q >= 0), "a mask overlay"),
                          (mu.bidirectional_mask_function, "bidirectional")):
        with pytest.raises(NotImplementedError, match=what):
            fph.causal_padding_mask(mask_function=pattern, **args)
    padding = torch.ones(1, 8, dtype=torch.bool)
    padding[0, 0] = False
    assert torch.equal(fph.causal_padding_mask(mask_function=mu.and_masks(
        causal, mu.padding_mask_function(padding)), attention_mask=padding, **args), padding)
    positions = torch.cat([torch.arange(5), torch.arange(3)])[None]
    sequences = mu.find_packed_sequence_indices(positions)
    if hasattr(mu, "packed_sequence_compatibility_function"):  # transformers >= 5.2x
        packed = mu.packed_sequence_compatibility_function(causal, positions, sequences)
    else:  # the releases before it: and_masks(causal, packed_sequence_mask_function)
        packed = mu.and_masks(causal, mu.packed_sequence_mask_function(sequences))
    assert fph.causal_padding_mask(mask_function=packed, **args) is None
    with pytest.raises(NotImplementedError, match="static cache"):
        fph.causal_padding_mask(batch_size=1, q_length=8, kv_length=9)
    assert fph.causal_padding_mask(batch_size=1, q_length=2, kv_length=9, q_offset=7) is None


@pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")  # renamed in 5.2x
@pytest.mark.parametrize("device,dtype,tol", PLACES)
def test_cached_decoding_matches_sdpa(device, dtype, tol, monkeypatch):
    """A prompt, then one token at a time against the cache (dense decoding), then a chunk of
    three tokens against the cache (a prefill with a cached prefix): the same logits as SDPA,
    from the library's calls (counted: prefill for the prompt and the chunk, dense attention
    for each single token, in each of the 2 layers)."""
    calls = {"prefill": 0, "dense_attention": 0}
    for name in calls:
        real = getattr(fp.api, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(fp.api, name, spy)
    ids = torch.randint(0, 512, (1, 150), device=device)
    steps = []
    for attn in ("sdpa", EXACT):
        model = llama(attn, device, dtype)
        with torch.no_grad():
            out = model(input_ids=ids[:, :140], use_cache=True)
            cache, got = out.past_key_values, [out.logits[:, -1]]
            for t in range(140, 147):
                out = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                got.append(out.logits[:, -1])
            out = model(input_ids=ids[:, 147:150], past_key_values=cache, use_cache=True)
            got.append(out.logits)
        steps.append(got)
    for i, (want, got) in enumerate(zip(*steps)):
        assert relative(got, want) < tol, f"step {i}"
    assert calls == {"prefill": 2 * 2, "dense_attention": 7 * 2}


@pytest.mark.parametrize("device,dtype,tol", PLACES)
def test_sparse_backend_runs_sparse_on_long_prompts(device, dtype, tol):
    """With a selection that leaves blocks out, the logits differ from exact attention but stay
    finite and close; on a prompt inside the forced blocks they are exact."""
    model = llama(SPARSE, device, dtype)
    short = torch.randint(0, 512, (1, 100), device=device)  # inside sink + window: dense
    model.config._attn_implementation = "sdpa"
    want_short = logits(model, input_ids=short)
    model.config._attn_implementation = SPARSE
    assert relative(logits(model, input_ids=short), want_short) < tol
    long = torch.randint(0, 512, (1, 1500), device=device)
    got = logits(model, input_ids=long)
    model.config._attn_implementation = "sdpa"
    want = logits(model, input_ids=long)
    assert torch.isfinite(got).all()
    assert 0 < relative(got, want) < 0.5


def test_unsupported_features_raise():
    q = torch.zeros(1, 4, 8, 64)
    kv = torch.zeros(1, 2, 8, 64)

    class Module:
        is_causal = True
        training = False

    for name, value in (("sliding_window", 4), ("softcap", 30.0), ("s_aux", torch.zeros(4)),
                        ("position_bias", torch.zeros(1, 4, 8, 8)), ("output_attentions", True)):
        with pytest.raises(NotImplementedError):
            fph.attention_forward(Module(), q, kv, kv, None, **{name: value})
    with pytest.raises(NotImplementedError, match="causal"):
        fph.attention_forward(Module(), q, kv, kv, None, is_causal=False)
    with pytest.raises(NotImplementedError, match="padding mask"):
        fph.attention_forward(Module(), q, kv, kv, torch.zeros(1, 1, 8, 8))
    training = Module()
    training.training = True
    with pytest.raises(NotImplementedError, match="dropout"):
        fph.attention_forward(training, q, kv, kv, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="static cache"):
        mask = torch.ones(1, 8, dtype=torch.bool)
        mask[0, -1] = False  # the new token's slot is empty: it is not the cache's last position
        fph.attention_forward(Module(), q[:, :, :2], kv, kv, mask)
    with pytest.raises(NotImplementedError, match="a padding mask of 9 positions for 8 keys"):
        fph.attention_forward(Module(), q, kv, kv, torch.ones(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="queries against"):
        fph.attention_forward(Module(), torch.zeros(1, 4, 9, 64), kv, kv, None)


def test_register_refuses_names_transformers_reserves():
    with pytest.raises(ValueError, match="contains 'flash'"):
        fph.register("flashprefill")


E4M3 = torch.float8_e4m3fn


def quantize_numpy(x):
    """Per-tensor e4m3 quantization written with numpy and ml_dtypes, independently of the
    backend: (round_e4m3(x * (1 / c)) with saturation, c = max|x| / 448)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = x.float().numpy()
    c = np.float32(np.abs(a).max()) / np.float32(448)
    return np.clip(a * (np.float32(1) / c), -448, 448).astype(ml_dtypes.float8_e4m3fn), c


class CausalModule:
    is_causal = True
    training = False


@pytest.mark.parametrize("len_q,len_k", [(300, 300), (1, 300), (40, 300)],
                         ids=["prefill", "decode", "cached-prefix"])
def test_fp8_call_is_the_library_fp8_call(len_q, len_k):
    """dtype="float8_e4m3": one attention call gives, bit for bit, the library's FP8 call on
    q, k and v quantized per tensor (over both requests of the batch) with their descales:
    prefill for several queries, dense attention for one."""
    torch.manual_seed(0)
    query = 3 * torch.randn(2, 4, len_q, 64)
    key, value = torch.randn(2, 2, len_k, 64), 0.5 * torch.randn(2, 2, len_k, 64)
    selection = dict(alpha=0.1, block_size=64, sink_tokens=64, window_tokens=64)
    got, _ = fph.attention_forward(CausalModule(), query, key, value, None, scaling=0.125,
                                   dtype=fph.FP8, **selection)
    assert got.dtype == torch.float32 and got.shape == (2, len_q, 4, 64)
    (q8, cq), (k8, ck), (v8, cv) = (quantize_numpy(t.transpose(1, 2).reshape(-1, *t.shape[1::2]))
                                    for t in (query, key, value))
    common = dict(softmax_scale=0.125, cu_seqlens_q=[0, len_q, 2 * len_q],
                  cu_seqlens_k=[0, len_k, 2 * len_k], q_descale=cq, k_descale=ck, v_descale=cv)
    if len_q == 1:
        want = fp.dense_attention(q8, k8, v8, **common)
    else:
        want = fp.prefill(q8, k8, v8, **common, **selection)
    assert want.dtype.name == "bfloat16"
    assert np.array_equal(got.reshape(-1, 4, 64).numpy(), want.astype(np.float32))


def test_fp8_kv_cache_call_is_the_library_call():
    """dtype="bfloat16", kv_dtype="float8_e4m3": bfloat16 q over k and v quantized per tensor
    (the library quantizes q per request and KV head)."""
    torch.manual_seed(1)
    query, key, value = torch.randn(1, 4, 200, 64), torch.randn(1, 2, 200, 64), torch.randn(1, 2, 200, 64)
    got, _ = fph.attention_forward(CausalModule(), query, key, value, None, alpha=0.0,
                                   dtype="bfloat16", kv_dtype=fph.FP8)
    (k8, ck), (v8, cv) = (quantize_numpy(t[0].transpose(0, 1)) for t in (key, value))
    q16 = query[0].transpose(0, 1).to(torch.bfloat16)
    want = fp.dense_attention(q16, torch.from_numpy(k8.view(np.uint8)).view(E4M3),
                              torch.from_numpy(v8.view(np.uint8)).view(E4M3),
                              k_descale=float(ck), v_descale=float(cv))
    assert torch.equal(got[0], want.float())


def test_bfloat16_call_is_the_library_bfloat16_call():
    torch.manual_seed(2)
    query, key, value = torch.randn(1, 4, 150, 64), torch.randn(1, 2, 150, 64), torch.randn(1, 2, 150, 64)
    got, _ = fph.attention_forward(CausalModule(), query, key, value, None, dtype="bfloat16")
    want = fp.prefill(*(t[0].transpose(0, 1).to(torch.bfloat16) for t in (query, key, value)))
    assert got.dtype == torch.float32 and torch.equal(got[0], want.float())


def test_fp8_model_is_close_to_sdpa_and_bfloat16_closer():
    """The whole model with exact (alpha = 0) attention in FP8 and in bfloat16 against float32
    SDPA: FP8's quantization error is visible and bounded, bfloat16's smaller."""
    model = llama("sdpa", "cpu", torch.float32)
    ids = torch.randint(0, 512, (1, 300))
    want = logits(model, input_ids=ids)
    errors = {}
    for suffix in ("_fp8", "_bf16"):
        model.config._attn_implementation = EXACT + suffix
        errors[suffix] = relative(logits(model, input_ids=ids), want)
    assert 0 < errors["_bf16"] < 1e-2 and errors["_bf16"] < errors["_fp8"] < 5e-2, errors


def test_precision_errors():
    q = torch.randn(1, 4, 8, 64)
    kv = torch.randn(1, 2, 8, 64)
    for dtype, kv_dtype in (("int8", None), (None, "bfloat16"), (fph.FP8, fph.FP8),
                            ("float32", fph.FP8)):
        with pytest.raises(ValueError, match="dtype"):
            fph.register(EXACT + "_bad", dtype=dtype, kv_dtype=kv_dtype)
        with pytest.raises(ValueError, match="dtype"):
            fph.attention_forward(CausalModule(), q, kv, kv, None, dtype=dtype, kv_dtype=kv_dtype)
    with pytest.raises(TypeError, match="bfloat16 or float16 query"):
        fph.attention_forward(CausalModule(), q, kv, kv, None, kv_dtype=fph.FP8)
    bad = kv.clone()
    bad[0, 0, 3, 5] = float("inf")  # a non-finite descale: refused, not quantized to +-448
    with pytest.raises(fp.FlashPrefillError, match="must be finite and > 0"):
        fph.attention_forward(CausalModule(), q, bad, kv, None, dtype=fph.FP8)


def test_quantize_per_tensor_of_zeros_has_descale_one():
    x8, c = fph.quantize_per_tensor(torch.zeros(3, 2, 8))
    assert float(c) == 1.0 and x8.dtype == E4M3 and not x8.float().any()


def test_quantize_per_tensor_of_tiny_values_keeps_a_normal_descale():
    """max|x| / 448 below the smallest normal float32 is held there: 1 / c stays finite, the
    zeros stay zeros, and the library takes the descale."""
    x = torch.tensor([0.0, 1e-37, -2e-37, 5e-38])
    x8, c = fph.quantize_per_tensor(x)
    tiny = torch.finfo(torch.float32).tiny
    assert float(c) == tiny
    values = x8.float() * c
    assert torch.isfinite(values).all() and float(values[0]) == 0.0
    assert torch.allclose(values, x, rtol=0.07, atol=0)


@pytest.mark.skipif(not (torch.cuda.is_available() and fp.cuda_available()),
                    reason="needs the library's CUDA path and a GPU")
def test_fp8_on_cuda_equals_the_cpu_reference():
    """FP8 Q/K/V and a bfloat16 q over an FP8 cache run the CUDA e4m3 kernels: their output is
    the CPU FP8 reference's on the same tensors (float32 arithmetic differs: 2e-2)."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 256, 64, generator=gen).to(torch.bfloat16)
    kv = torch.randn(1, 2, 256, 64, generator=gen).to(torch.bfloat16)
    for dtype, kv_dtype in ((fph.FP8, None), ("bfloat16", fph.FP8)):
        want = fph.attention_forward(CausalModule(), q, kv, kv, None, dtype=dtype,
                                     kv_dtype=kv_dtype)[0].float()
        got = fph.attention_forward(CausalModule(), q.cuda(), kv.cuda(), kv.cuda(), None,
                                    dtype=dtype, kv_dtype=kv_dtype)[0].float().cpu()
        assert torch.linalg.norm(got - want) <= 2e-2 * torch.linalg.norm(want)
