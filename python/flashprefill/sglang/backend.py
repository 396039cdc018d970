"""FlashPrefillAttnBackend: SGLang's AttentionBackend for EXTEND and MIXED batches.

init_forward_metadata (through init_forward_metadata_out_graph) builds one
layout.ExtendAttention per forward (lengths, the page table strided out of req_to_token, the
plans); forward_extend saves the layer's new K/V into the pool
as SGLang's backends do and runs the plan on the pool's buffers in place. Everything the library
cannot compute is refused when the backend is built (`check_model_runner`), before the first
request: MLA, cross attention (encoder-decoder models), encoder-only and bidirectional layers,
sliding-window layers (and hybrid SWA pools), chunked local attention, logit softcapping,
attention sinks, different K and V head sizes, quantized KV caches other than FP8 e4m3 (FP4,
e5m2), an FP8 KV cache under a float32 model, speculative decoding, and using it as the decode
backend.

FP8 KV caches (--kv-cache-dtype fp8_e4m3: the pool's dtype torch.float8_e4m3fn, stored as
uint8): SGLang's set_kv_buffer writes k / layer.k_scale (no division when the layer has no
scale) cast to e4m3; the library reads the pool's e4m3 view with layer.k_scale and
layer.v_scale as descales (None is 1) and quantizes the bfloat16 / float16 q itself
(docs/ALGORITHM.md "FP8 e4m3").
"""

import logging

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType, RadixAttention
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from .. import api
from . import BACKEND_NAME
from .layout import ExtendAttention, Settings, paged_kv

logger = logging.getLogger(__name__)

_CUDA_DTYPES = (torch.bfloat16, torch.float16)
_CPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CUDA_HEAD_DIMS = (64, 128)
_FP8_MODEL_DTYPES = (torch.bfloat16, torch.float16)  # of q over an FP8 e4m3 pool


class UnsupportedModelError(ValueError):
    """The model or server configuration needs something the backend cannot compute."""


def _refuse(what):
    raise UnsupportedModelError(
        f"--prefill-attention-backend {BACKEND_NAME}: {what} is not supported; serve this model "
        f"with another prefill attention backend")


def check_layer(layer, context_len=None):
    """Raises UnsupportedModelError for a RadixAttention layer the library cannot compute."""
    window = getattr(layer, "sliding_window_size", -1)
    if window is not None and window > -1 and (context_len is None or window < context_len):
        _refuse(f"sliding-window attention (layer {layer.layer_id}, window {window})")
    if getattr(layer, "logit_cap", 0.0) and layer.logit_cap > 0:
        _refuse(f"logit softcapping (layer {layer.layer_id}, cap {layer.logit_cap})")
    if getattr(layer, "is_cross_attention", False):
        _refuse(f"cross attention (layer {layer.layer_id})")
    attn_type = getattr(layer, "attn_type", AttentionType.DECODER)
    if attn_type != AttentionType.DECODER:
        _refuse(f"{attn_type.value} attention (layer {layer.layer_id}); the library is causal")
    if layer.qk_head_dim != layer.v_head_dim:
        _refuse(f"different K and V head sizes (layer {layer.layer_id}: {layer.qk_head_dim} and "
                f"{layer.v_head_dim})")


def check_runtime_setup():
    """Raises UnsupportedModelError for SGLang setups whose batches the backend would misread:
    decode context parallelism (a rank holds every dcp-th pool slot, at slot // dcp), attention
    context parallelism (a rank gets a share of the rows while the batch's lengths describe
    all of them), full prefill CUDA graphs (replayed over padded request slots with the capture's
    metadata) and diffusion language models. Read from SGLang's runtime context; a runner made
    outside SGLang's launch, whose context is not published, has none of them."""
    from sglang.srt import runtime_context

    try:  # ValueError / RuntimeError: not published; AttributeError: an SGLang without them
        parallel = runtime_context.get_parallel()
        dcp = getattr(parallel, "attn_dcp_size", 1) or 1
        cp = getattr(parallel, "attn_cp_size", 1) or 1
        execution = runtime_context.get_exec()
        dllm = execution.dllm.dllm_algorithm
        prefill_graph = execution.graph.cuda_graph_config.prefill.backend
    except (ValueError, RuntimeError, AttributeError):
        return
    if dcp > 1:
        _refuse(f"decode context parallelism (--dcp-size {dcp})")
    if cp > 1:
        _refuse(f"attention context parallelism (attn_cp_size {cp}, --enable-prefill-cp)")
    if dllm is not None:
        _refuse(f"diffusion language models (dllm_algorithm {dllm})")
    if getattr(prefill_graph, "value", prefill_graph) == "full":
        _refuse("full prefill CUDA graphs (--cuda-graph-backend-prefill full; breakable or "
                "disabled work)")


def check_model_runner(runner):
    """Raises UnsupportedModelError when the runner's model or setup cannot use the backend."""
    check_runtime_setup()
    if getattr(runner, "decode_attention_backend_str", None) == BACKEND_NAME:
        _refuse("decoding (the backend serves EXTEND and MIXED batches); add "
                "--decode-attention-backend fa3 (or flashinfer, triton)")
    if getattr(runner, "use_mla_backend", False):
        _refuse("multi-head latent attention (MLA)")
    spec = getattr(runner, "spec_algorithm", None)
    if spec is not None and not spec.is_none():
        _refuse("speculative decoding (its verify batches need a tree mask)")
    model_config = getattr(runner, "model_config", None)
    if model_config is not None:
        if getattr(model_config, "is_encoder_decoder", False):
            _refuse("an encoder-decoder model (cross attention)")
        if getattr(model_config, "attention_chunk_size", None):
            _refuse(f"chunked local attention (chunks of {model_config.attention_chunk_size})")
    if getattr(runner, "is_hybrid_swa", False):
        _refuse("hybrid sliding-window attention")
    pool = runner.token_to_kv_pool
    if type(pool) is not MHATokenToKVPool:
        _refuse(f"the KV pool {type(pool).__name__} (the backend reads MHATokenToKVPool)")
    fp8 = pool.dtype == torch.float8_e4m3fn
    if getattr(pool, "is_quantized_kv_cache", False):
        _refuse(f"a quantized KV cache ({getattr(pool.quant_method, 'name', pool.dtype)})")
    if pool.store_dtype != pool.dtype and not (fp8 and pool.store_dtype == torch.uint8):
        _refuse(f"a KV cache in {pool.dtype} (the library's FP8 format is e4m3: "
                f"torch.float8_e4m3fn)")
    if getattr(pool, "kv_cache_layout", "nhd") not in ("nhd", "hnd"):
        _refuse(f"the KV cache layout {pool.kv_cache_layout!r}")
    model_dtype = getattr(runner, "dtype", pool.dtype)
    if fp8 and model_dtype not in _FP8_MODEL_DTYPES:
        _refuse(f"an FP8 KV cache for a model in {model_dtype} (the library quantizes "
                f"bfloat16 or float16 queries over an e4m3 cache)")
    if not fp8 and pool.dtype != model_dtype:
        _refuse(f"a KV cache in {pool.dtype} for a model in {model_dtype}")
    on_cuda = torch.device(runner.device).type == "cuda"
    if torch.device(runner.device).type not in ("cuda", "cpu"):
        _refuse(f"the device {runner.device!r}")
    if model_dtype not in (_CUDA_DTYPES if on_cuda else _CPU_DTYPES):
        _refuse(f"the dtype {model_dtype} on {runner.device}")
    if on_cuda:
        if pool.head_dim not in _CUDA_HEAD_DIMS:
            _refuse(f"head size {pool.head_dim} on CUDA (the kernels take {_CUDA_HEAD_DIMS})")
        if not api.cuda_available():
            _refuse("CUDA without the library's CUDA build or an sm_90 GPU")
    model = getattr(runner, "model", None)
    if model is not None:
        context_len = getattr(model_config, "context_len", None)
        for module in model.modules():
            if isinstance(module, RadixAttention):
                check_layer(module, context_len)
        for name, _ in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("sinks", "attention_sinks"):
                _refuse(f"attention sinks ({name})")


class FlashPrefillAttnBackend(AttentionBackend):
    """FlashPrefill V2 for EXTEND and MIXED batches over SGLang's MHATokenToKVPool.

    Args:
        model_runner: SGLang's ModelRunner (device, req_to_token_pool, token_to_kv_pool,
            page_size; model, model_config and the rest for the start-up checks).
        settings: a layout.Settings; None reads FLASHPREFILL_* from the environment.
    """

    def __init__(self, model_runner, settings=None):
        super().__init__()
        self.settings = Settings.from_env() if settings is None else settings
        check_model_runner(model_runner)
        self.device = torch.device(model_runner.device)
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.page_size = self.token_to_kv_pool.page_size
        self.data_type = self.token_to_kv_pool.dtype
        self.kv_cache_dtype = self.token_to_kv_pool.dtype
        self.context_len = getattr(getattr(model_runner, "model_config", None), "context_len",
                                   None)
        self.forward_metadata = None
        logger.info("flashprefill prefill attention: %s", self.settings)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        # SGLang's init_forward_metadata (the eager entry point) runs this, then the no-op
        # init_forward_metadata_in_graph.
        mode = forward_batch.forward_mode
        if mode not in (ForwardMode.EXTEND, ForwardMode.MIXED):
            raise NotImplementedError(
                f"{BACKEND_NAME} serves EXTEND and MIXED batches, not {mode.name}")
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if seq_lens_cpu is None:
            seq_lens_cpu = forward_batch.seq_lens.cpu()
        extend_cpu = forward_batch.extend_seq_lens_cpu
        if extend_cpu is None:
            extend_cpu = forward_batch.extend_seq_lens.cpu()
        self.forward_metadata = ExtendAttention(
            forward_batch.seq_lens, forward_batch.extend_seq_lens, seq_lens_cpu, extend_cpu,
            self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices,
            self.page_size, self.settings)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if kwargs.get("sinks") is not None:
            _refuse(f"attention sinks (layer {layer.layer_id})")
        check_layer(layer, self.context_len)
        metadata = self.forward_metadata
        if metadata is None:
            raise RuntimeError(f"{BACKEND_NAME}: init_forward_metadata was not called for this "
                               f"batch")
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v,
                                                layer.k_scale, layer.v_scale)
        heads_q, head_dim = layer.tp_q_head_num, layer.qk_head_dim
        out = q.new_empty((q.shape[0], heads_q * head_dim))
        key = paged_kv(self.token_to_kv_pool.get_key_buffer(layer.layer_id), self.page_size)
        value = paged_kv(self.token_to_kv_pool.get_value_buffer(layer.layer_id), self.page_size)
        descales = {}
        if key.dtype == torch.float8_e4m3fn:  # the scales set_kv_buffer divided by
            descales = dict(k_descale=layer.k_scale, v_descale=layer.v_scale)
        metadata.run(q.reshape(-1, heads_q, head_dim), key, value, layer.scaling,
                     layer_id=layer.layer_id, out=out.view(-1, heads_q, head_dim), **descales)
        return out

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        raise NotImplementedError(
            f"{BACKEND_NAME} is a prefill backend; pair it with a decode backend "
            f"(--decode-attention-backend fa3)")

    def support_triton(self):
        return False
