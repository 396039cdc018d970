"""Per-layer prefill attention hooks: exact attention vs flashprefill's prefill.

Backends for the sparse side:
- `fp`: the flashprefill library (`flashprefill.prefill`, python/flashprefill over
  build/libflashprefill.so; FLASHPREFILL_LIB overrides the library path).
- `reference`: sparse_reference.prefill, the numpy model of docs/ALGORITHM.md.
The library takes numpy arrays on the CPU and torch CUDA tensors on the GPU, so on the torch path
q/k/v stay on the device; the reference always runs on host copies. The library's CUDA path takes
bfloat16 or float16 only (float32 is CPU-only): on the GPU the hook rounds the model's float32
q/k/v to `attn_dtype` (default bfloat16, the serving dtype) and widens the output back to float32.
- `tv-<rule>`: selection_variants.prefill, torch (GPU) variants of the selection rule, to say how
  much of the gap the rule itself costs (see selection_variants.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np

import sparse_reference
from model import Ops, exact_causal_attention

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class SparseConfig:
    alpha: float = 0.1
    block_size: int = 128
    mean_correction: bool = True
    sink_tokens: int = 256
    window_tokens: int = 512
    dense_recent_tiles: int = 1

    @property
    def label(self) -> str:
        return f"a{self.alpha:g}-bs{self.block_size}-{'corr' if self.mean_correction else 'nocorr'}"

    def kwargs(self) -> dict:
        return dataclasses.asdict(self)


def load_flashprefill():
    """Imports the project's Python package, or returns None when it (or its library) is missing."""
    path = os.path.join(REPO, "python")
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        import flashprefill
        flashprefill.prefill                                   # noqa: B018 - must exist
    except (ImportError, OSError, AttributeError):
        return None
    return flashprefill


def sparse_backend(name: str):
    """-> callable prefill(q, k, v, **SparseConfig.kwargs(), return_stats=True)."""
    if name == "reference":
        return sparse_reference.prefill
    if name.startswith("tv-"):
        import functools
        import selection_variants
        return functools.partial(selection_variants.prefill, rule=name[3:])
    if name == "fp":
        fp = load_flashprefill()
        if fp is None:
            raise RuntimeError("flashprefill is not importable: build it (bash scripts/setup.sh && "
                               "cmake --build build) or use --backend reference")
        return fp.prefill
    raise ValueError(f"unknown backend {name!r}")


class LayerRecorder:
    """Per-layer density and attention-output error of one prefill."""

    def __init__(self, n_layers: int):
        self.density = np.full(n_layers, np.nan)
        self.rel_err = np.full(n_layers, np.nan)
        self.pair_density = np.full(n_layers, np.nan)      # selection_variants only

    def summary(self) -> dict:
        out = {"density_per_layer": self.density.tolist(), "rel_err_per_layer": self.rel_err.tolist(),
               "density": float(np.nanmean(self.density))}
        if not np.isnan(self.pair_density).all():
            out["pair_density"] = float(np.nanmean(self.pair_density))
        return out


def make_sparse_hook(ops: Ops, prefill_fn, config: SparseConfig, scale: float,
                     recorder: LayerRecorder, layer_errors: bool, attn_dtype: str = "bfloat16"):
    """Hook running flashprefill's prefill in every layer. With layer_errors, also runs exact attention
    on the same (float32) q/k/v to record the layer's local relative L2 error (no error propagation
    in it). On the torch path q/k/v stay on the device: the library gets them rounded to
    `attn_dtype` ("float32" keeps them, for the torch variants); the numpy reference gets host copies."""
    on_host = ops.torch is None or prefill_fn is sparse_reference.prefill

    def hook(layer, q, k, v):
        if on_host:
            q, k, v = (np.ascontiguousarray(ops.numpy(t), dtype=np.float32) for t in (q, k, v))
            args = (q, k, v)
        else:
            dtype = getattr(ops.torch, attn_dtype)
            args = tuple(t.to(dtype).contiguous() for t in (q, k, v))
        out, stats = prefill_fn(*args, softmax_scale=scale, return_stats=True, **config.kwargs())
        if not on_host:
            out = out.float()
        recorder.density[layer] = stats["density"]
        recorder.pair_density[layer] = stats.get("pair_density", np.nan)
        if layer_errors:
            exact = exact_causal_attention(Ops() if on_host else ops, q, k, v, 0, scale)
            if on_host:
                recorder.rel_err[layer] = float(np.linalg.norm(out - exact) / np.linalg.norm(exact))
            else:
                recorder.rel_err[layer] = float(ops.torch.linalg.vector_norm(out - exact)
                                                / ops.torch.linalg.vector_norm(exact))
        return ops.asarray(out) if on_host else out

    return hook
