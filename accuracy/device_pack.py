"""Packs the model and the token ids for a GPU machine that lacks the model package, the GGUF
reader or the corpora (accuracy/device_run.sh runs the study from such a pack).

The pack keeps every tensor in its original quantized bytes (Q4_1 / Q8_0 / F32, dequantized on
arrival by the same code as the GGUF path, so the weights are bit-identical) and splits them into
files of at most PART_BYTES, which copy easily:

    accuracy/.device/part0.npz  part1.npz   (+ tokens.npz: the corpora as token ids)

    python3 accuracy/device_pack.py            # writes accuracy/.device/
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import corpus                                               # noqa: E402
from gguf_weights import (LlamaConfig, dequantize_q4_1, dequantize_q8_0,  # noqa: E402
                          pinned_gguf_path, read_gguf)
from tokenizer import ByteLevelBPE                          # noqa: E402

PART_BYTES = 48 * 2**20
TOKENS_PER_TEXT = 8192


def write_pack(gguf_path: str, out_dir: str) -> list[str]:
    from gguf import GGUFReader

    config, _, tables = read_gguf(gguf_path)
    reader = GGUFReader(gguf_path)
    os.makedirs(out_dir, exist_ok=True)
    meta = {"config": dataclasses.asdict(config), "tensors": {}}
    parts, current, size = [], {}, 0
    for t in reader.tensors:
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        if size + raw.nbytes > PART_BYTES and current:
            parts.append(current)
            current, size = {}, 0
        current[t.name] = raw
        size += raw.nbytes
        meta["tensors"][t.name] = {"type": t.tensor_type.name, "n": int(t.n_elements),
                                   "shape": [int(s) for s in reversed(t.shape)], "part": len(parts)}
    parts.append(current)
    parts[0]["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    parts[0]["__tokenizer__"] = np.frombuffer(json.dumps(tables).encode(), dtype=np.uint8)
    paths = []
    for i, arrays in enumerate(parts):
        path = os.path.join(out_dir, f"part{i}.npz")
        np.savez(path, **arrays)
        paths.append(path)
    tokenizer = ByteLevelBPE(tables)
    tok_path = os.path.join(out_dir, "tokens.npz")
    corpus.save_token_pack(tok_path, tokenizer, TOKENS_PER_TEXT)
    return paths + [tok_path]


def load_pack(pack_dir: str):
    """-> (config, float32 weights, tokenizer tables), exactly as read_gguf returns them."""
    files = {}
    for path in sorted(glob.glob(os.path.join(pack_dir, "part*.npz"))):
        z = np.load(path)
        files.update({name: z[name] for name in z.files})
    meta = json.loads(files.pop("__meta__").tobytes())
    tables = json.loads(files.pop("__tokenizer__").tobytes())
    weights = {}
    for name, info in meta["tensors"].items():
        if name not in files:
            raise FileNotFoundError(f"{name} missing: copy every part{info['part']}.npz of the pack")
        raw = files[name]
        if info["type"] == "Q4_1":
            w = dequantize_q4_1(raw, info["n"])
        elif info["type"] == "Q8_0":
            w = dequantize_q8_0(raw, info["n"])
        elif info["type"] == "F32":
            w = raw.view(np.float32)
        else:
            raise ValueError(f"{name}: unsupported type {info['type']}")
        weights[name] = w.reshape(info["shape"])
    return LlamaConfig(**meta["config"]), weights, tables


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", default=None)
    p.add_argument("--out", default=os.path.join(HERE, ".device"))
    args = p.parse_args()
    for path in write_pack(args.gguf or pinned_gguf_path(), args.out):
        print(f"{os.path.getsize(path) / 2**20:7.1f} MiB  {path}")


if __name__ == "__main__":
    main()
