"""flashprefill: block-sparse long-context prefill attention (FlashPrefill V2) over the library's
C ABI (include/flashprefill/flashprefill.h), through ctypes.

    import flashprefill as fp
    out = fp.prefill(q, k, v)                          # q [total_q, Hq, D], k, v [total_k, Hkv, D]
    out, stats = fp.prefill(q, k, v, alpha=0.2, return_stats=True)   # stats['density']
    ref = fp.dense_attention(q, k, v)
    out = fp.prefill(q, fp.PagedKV(k_cache, v_cache, page_table, seqlens_k))

Arrays are numpy (CPU; float32, float16, and bfloat16 through ml_dtypes) or torch tensors (CPU or
CUDA; float32, bfloat16, float16). FP8 e4m3 (ml_dtypes / torch float8_e4m3fn q, k, v, or a
bf16/fp16 q over an e4m3 KV cache, with descales) runs on the CPU, and on CUDA for e4m3 q, k, v
in build_index, pool_kv, dense_attention and sparse_attention (attention: contiguous KV).
api.py states the
shared conventions (layouts, varlen metadata, causal alignment, places, FP8); each call's
docstring states its tensors.

Plan/run for serving engines (plan.py): `plan = fp.Plan(...)` once per forward from the batch's
metadata, `plan.run(q, k, v)` per layer with the least host work; `kv_dtype=float8_e4m3fn` makes
it a plan over an FP8 KV cache, whose run() takes each layer's descales.

The attention calls and Plan take `tuning=fp.AttentionTuning(num_splits=1)` (or head_section,
lead_tiles) to fix the CUDA attention stage's work layout instead of the library's heuristic.

torch custom ops: `import flashprefill.torch` registers torch.ops.flashprefill.* (prefill,
dense_attention, build_index, pool_kv, sparse_attention and their out-variants, FP8 e4m3 with
optional q_descale / k_descale / v_descale tensors), which work under torch.compile and CUDA
graphs (torch.py).

Hugging Face transformers: `import flashprefill.hf; flashprefill.hf.register()`, then
attn_implementation="sparse_prefill" (hf.py; needs torch and transformers, imported only there).

The shared library is found through FLASHPREFILL_LIB, else inside the installed package, else
build/libflashprefill.so of the repository this package sits in, else the system library path.
"""

from ._index import Index, IndexSizes, SelectConfig
from ._lib import KV_TILE, MAX_SPLITS, TILE_ROWS, FlashPrefillError, Status, version
from ._problem import AttentionTuning, PagedKV
from .plan import Plan
from .api import (build_index, cuda_available, dense_attention, index_sizes, pool_kv, prefill,
                  sparse_attention)

__version__ = version()

__all__ = [
    "AttentionTuning", "FlashPrefillError", "Index", "IndexSizes", "KV_TILE", "MAX_SPLITS",
    "PagedKV", "Plan", "SelectConfig", "Status", "TILE_ROWS", "build_index", "cuda_available",
    "dense_attention", "index_sizes", "pool_kv", "prefill", "sparse_attention",
]
