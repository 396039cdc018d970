"""Per-layer prefill attention hooks: exact attention vs flashprefill's prefill.

Backends for the sparse side:
- `fp`: the flashprefill library (`flashprefill.prefill`, python/flashprefill over
  build/libflashprefill.so; FLASHPREFILL_LIB overrides the library path).
- `reference`: sparse_reference.prefill, the numpy model of docs/ALGORITHM.md.
The library takes numpy arrays on the CPU and torch CUDA tensors on the GPU, so on the torch path
q/k/v stay on the device; the reference always runs on host copies.
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

    def summary(self) -> dict:
        return {"density_per_layer": self.density.tolist(), "rel_err_per_layer": self.rel_err.tolist(),
                "density": float(np.nanmean(self.density))}


def make_sparse_hook(ops: Ops, prefill_fn, config: SparseConfig, scale: float,
                     recorder: LayerRecorder, layer_errors: bool):
    """Hook running flashprefill's prefill in every layer. With layer_errors, also runs exact attention
    on the same q/k/v to record the layer's local relative L2 error (no error propagation in it).
    The library takes torch CUDA tensors as they are; the numpy reference gets host copies."""
    on_host = ops.torch is None or prefill_fn is sparse_reference.prefill

    def hook(layer, q, k, v):
        if on_host:
            q, k, v = (np.ascontiguousarray(ops.numpy(t), dtype=np.float32) for t in (q, k, v))
        else:
            q, k, v = (t.contiguous() for t in (q, k, v))
        out, stats = prefill_fn(q, k, v, softmax_scale=scale, return_stats=True, **config.kwargs())
        recorder.density[layer] = stats["density"]
        if layer_errors:
            exact = exact_causal_attention(Ops() if on_host else ops, q, k, v, 0, scale)
            diff, ref = (ops.numpy(out - exact) if not on_host else out - exact), ops.numpy(exact)
            recorder.rel_err[layer] = float(np.linalg.norm(diff) / np.linalg.norm(ref))
        return ops.asarray(out) if on_host else out

    return hook
