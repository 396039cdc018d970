"""Writes the study's prompts (tasks.py) as token ids to a pack that run.py reads on any machine.

Needs the model's tokenizer (from the GGUF, through transformers) and the corpora (Debian's
bible-kjv-text, this Python's standard library); the machine that runs the study needs neither.

    python3 accuracy/make_prompts.py [--out accuracy/.pack/prompts.npz] [--needles 108]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import corpus                                      # noqa: E402
import hf_model                                    # noqa: E402
import tasks                                       # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", help="default: the pinned wheel's")
    p.add_argument("--out", default=os.path.join(HERE, ".pack", "prompts.npz"))
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--needles", type=int, default=108, help="needle prompts per length")
    p.add_argument("--windows", type=int, default=4, help="text windows per text and length")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    folder, name = os.path.split(os.path.abspath(hf_model.resolve_gguf(args.gguf)))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    # byte-level BPE pieces: "Ġ" is a space, "Ċ" a newline
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    ends = np.asarray([s.rstrip("ĠĊ").endswith((".", ";", ":")) for s in pieces])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tasks.build_pack(args.out, encode, corpus.encoded(encode), args.lengths, args.needles,
                     args.windows, ends)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
