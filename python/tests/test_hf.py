"""The transformers backend (flashprefill.hf) on a small random Llama: with alpha = 0 every call
is exact attention, so the model's logits must match transformers' own SDPA backend (padded
batches, packed rows and cached decoding included); with the default selection the calls are
sparse. Runs on the CPU (float32) and, where torch sees a GPU and the library has its CUDA
path, on the GPU (bfloat16)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashprefill as fp  # noqa: E402
import flashprefill.hf as fph  # noqa: E402

EXACT = "sparse_prefill_exact_test"
SPARSE = "sparse_prefill_test"
fph.register(EXACT, alpha=0.0)
fph.register(SPARSE, sink_tokens=64, window_tokens=64, block_size=64)

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
    with pytest.raises(ValueError, match="queries against"):
        fph.attention_forward(Module(), torch.zeros(1, 4, 9, 64), kv, kv, None)


def test_register_refuses_names_transformers_reserves():
    with pytest.raises(ValueError, match="contains 'flash'"):
        fph.register("flashprefill")
