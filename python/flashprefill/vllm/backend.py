"""vLLM attention backends over flashprefill (imports vLLM; register() in __init__.py loads it).

FLASHPREFILL (CUDA): prefill and extend requests run FlashPrefill V2 block-sparse attention on
the paged KV cache in place (batch.py), decode requests run vLLM's FlashAttention backend,
which also writes the cache (FLASH_ATTN's layout; the impl and builder hold a FlashAttention
impl and builder and hand them the decode requests).

FlashPrefillCPUBackend (vLLM's CPU platform, in place of CPU_ATTN when FLASHPREFILL_VLLM_CPU=1):
the same cache layout convention as FLASH_ATTN (keys then values in a token's slot), written
here, and every request through the library's CPU path (prefill block-sparse, decode exact),
because CPU_ATTN's decode kernel reads only its own cache layout.

FP8 KV caches (kv_cache_dtype "fp8" or "fp8_e4m3"; not "fp8_e5m2"): vLLM allocates the cache
as uint8 and writes round_e4m3(x / scale) with the layer's _k_scale and _v_scale (1 unless the
checkpoint carries scales); the library reads it as float8_e4m3fn with those scales as its
descales, under a bfloat16 or float16 model (docs/ALGORITHM.md "FP8 e4m3").

Settings: batch.Settings, read from FLASHPREFILL_* variables when a metadata builder is made.
With FLASHPREFILL_KEEP_MEANS=1 every layer's impl keeps a batch.KeptMeans beside its cache: the
cache update marks the written blocks' means stale, the forward pools only what is not current.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImpl,
                                       AttentionMetadataBuilder, AttentionType,
                                       CommonAttentionMetadata, MultipleOf)

from . import batch as fp_batch

NAME = "FLASHPREFILL"


@dataclass
class FlashPrefillMetadata:
    """One forward's metadata, shared by every layer: `batch` (the library's requests) and,
    on CUDA, `decode` (FlashAttention's metadata of the decode requests, or None)."""

    num_actual_tokens: int
    batch: fp_batch.ForwardBatch
    decode: object = None


FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")


def _is_fp8(kv_cache_dtype):
    return kv_cache_dtype in FP8_KV_CACHE_DTYPES


def kv_cache_dtype_refusal(kv_cache_dtype, supported):
    """Why a kv_cache_dtype outside `supported` is refused, naming it."""
    if kv_cache_dtype == "fp8_e5m2":
        return ("the fp8_e5m2 KV cache: the library's FP8 format is e4m3 (kv_cache_dtype fp8 or "
                "fp8_e4m3)")
    return f"the {kv_cache_dtype} KV cache (only {', '.join(supported)})"


def refuse_fp8_under_float32(vllm_config):
    """Raises ValueError for an FP8 KV cache under a float32 model: the library quantizes a
    bfloat16 or float16 q over an e4m3 cache, not a float32 one."""
    cache = getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto")
    model = getattr(getattr(vllm_config, "model_config", None), "dtype", None)
    if _is_fp8(cache) and model == torch.float32:
        raise ValueError(f"{NAME}: the {cache} KV cache needs a bfloat16 or float16 model "
                         f"(--dtype), not float32: the library computes an FP8 KV cache under "
                         f"bfloat16 / float16 queries")


def _refuse_unsupported(alibi_slopes, sliding_window, logits_soft_cap, attn_type, kwargs):
    reasons = []
    if alibi_slopes is not None:
        reasons.append("ALiBi position biases")
    if sliding_window is not None:
        reasons.append("sliding-window attention")
    if logits_soft_cap:
        reasons.append("logit softcapping")
    if attn_type != AttentionType.DECODER:
        reasons.append(f"attention type {attn_type} (only causal decoder self-attention)")
    if kwargs.get("sinks") is not None:
        reasons.append("attention sinks")
    if kwargs.get("kv_sharing_target_layer_name") is not None:
        reasons.append("KV sharing across layers")
    unknown = sorted(k for k, v in kwargs.items()
                     if v is not None and k not in ("sinks", "kv_sharing_target_layer_name"))
    reasons += [f"the layer argument {k}" for k in unknown]
    if reasons:
        raise NotImplementedError(f"{NAME} does not support " + ", ".join(reasons))


class _Common:
    """What both backends share."""

    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name():
        return NAME

    @classmethod
    def supports_attn_type(cls, attn_type):
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sink(cls):
        return False

    @classmethod
    def supports_sliding_window(cls):
        return False

    @classmethod
    def supports_non_causal(cls):
        return False


class FlashPrefillBackend(_Common, AttentionBackend):
    """`--attention-backend FLASHPREFILL` on CUDA (sm_90, bf16 / fp16, head size 64 / 128)."""

    supported_dtypes: ClassVar[list] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16",
                                                 *FP8_KV_CACHE_DTYPES]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(16)]

    @classmethod
    def get_supported_head_sizes(cls):
        return [64, 128]

    @classmethod
    def supports_compute_capability(cls, capability):
        return capability.major == 9

    @classmethod
    def validate_configuration(cls, *args, **kwargs):
        reasons = super().validate_configuration(*args, **kwargs)
        # vLLM's own reason names no dtype: this one does.
        kv_cache_dtype = kwargs.get("kv_cache_dtype", args[2] if len(args) > 2 else None)
        reasons = [f"{NAME} does not support " +
                   kv_cache_dtype_refusal(kv_cache_dtype, cls.supported_kv_cache_dtypes)
                   if r == "kv_cache_dtype not supported" else r for r in reasons]
        import flashprefill
        if not flashprefill.cuda_available():
            reasons.append("the flashprefill library has no CUDA path here or sees no sm_90 GPU")
        return reasons

    @staticmethod
    def get_impl_cls():
        return FlashPrefillImpl

    @staticmethod
    def get_builder_cls():
        return FlashPrefillMetadataBuilder


def _ensure_reordered(builder):
    builder._init_reorder_batch_threshold(1)


def _forward_batch(builder, m: CommonAttentionMetadata, include_decodes):
    num_reqs = m.num_reqs
    seq_lens_cpu = m.seq_lens_cpu_upper_bound
    if seq_lens_cpu is None and m.seq_lens.device.type == "cpu":
        seq_lens_cpu = m.seq_lens
    return fp_batch.ForwardBatch(
        builder.settings, m.query_start_loc[:num_reqs + 1], m.seq_lens[:num_reqs],
        m.block_table_tensor[:num_reqs],
        query_start_loc_cpu=m.query_start_loc_cpu[:num_reqs + 1],
        seq_lens_cpu=None if seq_lens_cpu is None else seq_lens_cpu[:num_reqs],
        include_decodes=include_decodes, num_actual_tokens=m.num_actual_tokens)


class FlashPrefillMetadataBuilder(AttentionMetadataBuilder[FlashPrefillMetadata]):
    """Decodes first (reorder_batch_threshold = 1); one ForwardBatch per forward, and
    FlashAttention's metadata for the decode requests."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
        self.settings = fp_batch.Settings.from_env()
        fp_batch.refuse_kept_means_with_kv_transfer(self.settings, vllm_config)
        refuse_fp8_under_float32(vllm_config)
        self.decode_builder = FlashAttentionMetadataBuilder(kv_cache_spec, layer_names,
                                                            vllm_config, device)
        _ensure_reordered(self)

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        forward = _forward_batch(self, m, include_decodes=False)
        decode = None
        if forward.num_decodes:
            decode = self.decode_builder.build(
                0, m.unpadded(forward.num_decode_tokens, forward.num_decodes), fast_build)
        return FlashPrefillMetadata(m.num_actual_tokens, forward, decode)


class _Impl(AttentionImpl):
    """The layer's shape; refuses what the library cannot compute."""

    kv_cache_dtypes = ("auto", "float16", "bfloat16", *FP8_KV_CACHE_DTYPES)

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes=None,
                 sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None,
                 attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 **kwargs):
        _refuse_unsupported(alibi_slopes, sliding_window, logits_soft_cap, attn_type,
                            dict(kwargs, kv_sharing_target_layer_name=kv_sharing_target_layer_name))
        if kv_cache_dtype not in self.kv_cache_dtypes:
            raise NotImplementedError(f"{NAME} does not support " +
                                      kv_cache_dtype_refusal(kv_cache_dtype, self.kv_cache_dtypes))
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.fp8 = _is_fp8(kv_cache_dtype)
        self.attn_type = attn_type
        self.settings = fp_batch.Settings.from_env()  # the builders' settings, read alike
        self.kept_means = None  # batch.KeptMeans of this layer's cache (keep_means)

    def _cache_scales(self, layer):
        """The layer's FP8 cache scales as the library's k/v descales ({} without an FP8
        cache): one per tensor. A checkpoint with one scale per KV head (kv_cache_scheme
        strategy attn_head) is refused here, as vLLM's CUDA backends refuse it by
        supports_per_head_quant_scales."""
        if not self.fp8:
            return {}
        for name in ("_k_scale", "_v_scale"):
            n = getattr(layer, name).numel()
            if n != 1:
                raise NotImplementedError(f"{NAME} takes one FP8 KV cache scale per tensor; "
                                          f"layer.{name} holds {n} (per-head KV cache scales "
                                          f"are not supported)")
        return dict(k_scale=layer._k_scale, v_scale=layer._v_scale)

    def _kept_means(self, key_cache):
        """This layer's KeptMeans for key_cache (made at the first cache update or forward,
        and again when the cache is reallocated), or None without keep_means."""
        if not self.settings.keep_means:
            return None
        if self.kept_means is None or not self.kept_means.fits(key_cache):
            self.kept_means = fp_batch.KeptMeans(key_cache, self.settings.block_size,
                                                 self.settings.mean_correction)
        return self.kept_means

    def _invalidate_kept_means(self, kv_cache, slot_mapping):
        """After a cache update: the means of the blocks it wrote are stale."""
        kept = self._kept_means(fp_batch.kv_views(kv_cache, self.head_size)[0])
        if kept is not None:
            kept.invalidate(slot_mapping)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        """query, output [tokens, Hq, D]; kv_cache this layer's [num_blocks, Hkv, block, 2D]."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(f"{NAME} does not support fused output quantization")
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        # An FP8 cache: the layer's cache scales are its descales; q stays in the model's
        # dtype (supports_quant_query_input is False, so the layer does not quantize it) and
        # the library quantizes it with max|q| / 448 per request and KV head, not with
        # layer._q_scale (the checkpoint's q scale, or vLLM's copy of its k scale).
        scales = self._cache_scales(layer)
        if attn_metadata.decode is not None:
            self.decode_impl.forward(layer, self._decode_query(layer, query, attn_metadata),
                                     key, value, kv_cache, attn_metadata.decode, output)
        key_cache, value_cache = fp_batch.kv_views(kv_cache, self.head_size)
        attn_metadata.batch.run(query, key_cache, value_cache, output, self.scale,
                                self._kept_means(key_cache), **scales)
        return output


class FlashPrefillImpl(_Impl):
    """Prefill / extend rows through the library, decode rows through FlashAttention."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl
        self.decode_impl = FlashAttentionImpl(self.num_heads, self.head_size, self.scale,
                                              self.num_kv_heads, None, None,
                                              self.kv_cache_dtype, None, self.attn_type, None)

    def get_impl_variants(self):
        return (self, self.decode_impl)

    def _decode_query(self, layer, query, attn_metadata):
        """The decode rows of query as FlashAttention takes them: over an FP8 cache, a
        FlashAttention that takes a quantized query gets it quantized with layer._q_scale as
        vLLM's attention layer quantizes it for FLASH_ATTN (QuantFP8: x * (1 / scale), saturating
        at the e4m3 range); otherwise query as it is."""
        if not (self.fp8 and self.decode_impl.supports_quant_query_input):
            return query
        scale = layer._q_scale
        if scale.numel() != 1:
            raise NotImplementedError(f"{NAME}: per-head query scales over an FP8 KV cache")
        rows = query[:attn_metadata.batch.num_decode_tokens].to(torch.float32)
        return (rows * scale.to(torch.float32).reciprocal()).clamp(-448.0, 448.0).to(
            torch.float8_e4m3fn)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        self.decode_impl.do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        self._invalidate_kept_means(kv_cache, slot_mapping)


class FlashPrefillCPUBackend(_Common, AttentionBackend):
    """vLLM's CPU platform: every request through the library's CPU path (see the module
    docstring); float32, bfloat16 and float16."""

    supported_dtypes: ClassVar[list] = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float32", "float16", "bfloat16",
                                                 *FP8_KV_CACHE_DTYPES]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(1)]

    @staticmethod
    def get_impl_cls():
        return FlashPrefillCPUImpl

    @staticmethod
    def get_builder_cls():
        return FlashPrefillCPUMetadataBuilder


class FlashPrefillCPUMetadataBuilder(AttentionMetadataBuilder[FlashPrefillMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.settings = fp_batch.Settings.from_env()
        fp_batch.refuse_kept_means_with_kv_transfer(self.settings, vllm_config)
        refuse_fp8_under_float32(vllm_config)
        _ensure_reordered(self)

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        return FlashPrefillMetadata(m.num_actual_tokens,
                                    _forward_batch(self, m, include_decodes=True))


class FlashPrefillCPUImpl(_Impl):
    """Every row through the library's CPU path; writes the cache itself (batch.write_kv)."""

    kv_cache_dtypes = ("auto", "float32", "float16", "bfloat16", *FP8_KV_CACHE_DTYPES)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        key_cache, value_cache = fp_batch.kv_views(kv_cache, self.head_size)
        scales = self._cache_scales(layer)
        fp_batch.write_kv(key, value, key_cache, value_cache, slot_mapping, **scales)
        self._invalidate_kept_means(kv_cache, slot_mapping)
