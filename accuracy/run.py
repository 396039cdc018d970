"""Accuracy study driver: SmolLM2-135M-Instruct through transformers, dense (SDPA) against
flashprefill (`flashprefill.hf`, every layer) and against variants of the selection rule.

Prompts come from a pack (make_prompts.py). Per length, the prompts run in batches of equal length
(no padding): each batch once dense, then once per sparse configuration, each run a prefill of the
whole batch, the logits at the held-out positions and a greedy answer (dense decode, as in the
paper). A configuration is an alpha, a block size, mean correction on or off and the precision of
the library's attention (--attn-dtypes: the model's, bfloat16, or FP8 e4m3 Q/K/V quantized per
tensor, decode steps included) and of its KV (--kv-dtypes: as q, or an e4m3 cache quantized per
tensor under a 16-bit q). One JSON line per (prompt, configuration) is appended to --out.

    python3 accuracy/run.py --prompts accuracy/.pack/prompts.npz --lengths 2048 --needles 6 \\
        --windows 1 --alphas 0.1 --out accuracy/results/cpu/x.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_model                                   # noqa: E402
import tasks                                      # noqa: E402
from hf_model import Recorder, SparseConfig       # noqa: E402

DEFAULT_PACK = os.path.join(HERE, ".pack", "prompts.npz")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", help="the model's GGUF (default: the pinned wheel's)")
    p.add_argument("--prompts", default=DEFAULT_PACK, help="prompt pack (make_prompts.py)")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--needles", type=int, default=108, help="needle prompts per length")
    p.add_argument("--windows", type=int, default=2, help="text windows per text and length")
    p.add_argument("--needle-kinds", nargs="+", choices=tasks.KINDS, default=list(tasks.KINDS),
                   help="run only the needles of these kinds (among the first --needles)")
    p.add_argument("--texts", nargs="+", default=["kjv", "code"], help="texts of the windows")
    p.add_argument("--alphas", type=float, nargs="*", default=[0.1],
                   help="flashprefill configurations (0: every block, the library's floor)")
    p.add_argument("--block-sizes", type=int, nargs="+", default=[128])
    p.add_argument("--corrections", nargs="+", choices=["on", "off"], default=["on"])
    p.add_argument("--attn-dtypes", nargs="+", default=["model"],
                   choices=["model", *hf_model.DTYPE_LABELS],
                   help="precisions of the library's attention (flashprefill.hf's dtype): the "
                        "model's, or q/k/v cast to bfloat16 / float16, or float8_e4m3 (q, k, v "
                        "quantized per tensor); each with every alpha and correction")
    p.add_argument("--kv-dtypes", nargs="+", default=["same"], choices=["same", "float8_e4m3"],
                   help="the library's K/V: as q (same), or float8_e4m3 (an e4m3 cache, k and v "
                        "quantized per tensor, q left in a 16-bit --attn-dtypes precision); each "
                        "with every attention precision, alpha and correction")
    p.add_argument("--rules", nargs="*", default=[],
                   help="selection_variants rules run beside the library (paper, freemax, topp, "
                        "rownorm, perhead, oracle), at --rule-alphas, correction on, block 128")
    p.add_argument("--rule-alphas", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2])
    p.add_argument("--rule-needles", action="store_true",
                   help="run the rules on the needle prompts too (default: text windows only)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--batch", type=int, default=1, help="prompts per forward")
    p.add_argument("--mix-kinds", action="store_true",
                   help="batch prompts of different kinds together (every prompt of a batch "
                        "then decodes as many tokens as the longest answer needs)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no new batch after this")
    p.add_argument("--out", required=True, help="JSON lines file (appended)")
    return p.parse_args(argv)


def configurations(args, recorder):
    """[(backend, attn_implementation name, SparseConfig)] of every sparse run."""
    out = []
    for dtype, kv, bs, alpha, corr in itertools.product(args.attn_dtypes, args.kv_dtypes,
                                                        args.block_sizes, args.alphas,
                                                        args.corrections):
        if alpha == 0 and corr == "on" and "off" in args.corrections:
            continue                       # alpha 0 selects every block: nothing to correct
        cfg = SparseConfig(alpha=alpha, block_size=bs, mean_correction=corr == "on",
                           dtype=None if dtype == "model" else dtype,
                           kv_dtype=None if kv == "same" else kv)
        out.append(("fp", hf_model.register_flashprefill(cfg, recorder), cfg))
    for rule, alpha in itertools.product(args.rules, args.rule_alphas):
        cfg = SparseConfig(alpha=alpha)
        out.append((f"tv-{rule}", hf_model.register_variant(rule, cfg, recorder), cfg))
    return out


def batches(prompts, size, mix_kinds=False):
    """Prompts in chunks of `size`, grouped by kind first (one answer length a batch) unless
    mix_kinds."""
    groups = [prompts] if mix_kinds else [[p for p in prompts if p.kind == kind]
                                          for kind in ["text", *tasks.KINDS]]
    for group in groups:
        for i in range(0, len(group), size):
            yield group[i:i + size]


def forward(model, attn, batch):
    """One batched prefill with attention `attn`, then dense greedy decoding.
    -> (logits at each prompt's eval rows [n_i, V] float32, answer ids per prompt)."""
    import torch
    from transformers import DynamicCache

    model.set_attn_implementation(attn)
    device = model.device
    ids = torch.as_tensor(np.stack([p.tokens for p in batch]), device=device)
    steps = max(p.answer_tokens for p in batch)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        hidden = model.model(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state
        logits = [model.lm_head(hidden[b, torch.as_tensor(p.eval_rows, device=device)]).float()
                  for b, p in enumerate(batch)]
        answers = []
        if steps:
            token = model.lm_head(hidden[:, -1]).argmax(-1)
            answers.append(token)
            for _ in range(steps - 1):
                out = model(input_ids=token[:, None], past_key_values=cache, use_cache=True)
                token = out.logits[:, -1].argmax(-1)
                answers.append(token)
        answer_ids = (torch.stack(answers, 1).tolist() if answers else [[] for _ in batch])
    return logits, [a[:p.answer_tokens] for a, p in zip(answer_ids, batch)]


def main(argv=None):
    args = parse_args(argv)
    import torch
    import transformers

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    model, tokenizer = hf_model.load(args.gguf, device, dtype)
    prompts = tasks.load_pack(args.prompts)
    recorder = Recorder()
    configs = configurations(args, recorder)
    command = "python3 accuracy/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    env = {"device": f"{device_name} ({dtype})", "torch": torch.__version__,
           "transformers": transformers.__version__, "threads": torch.get_num_threads(),
           "command": command}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def emit(record):
        record.update(env, date=datetime.datetime.now(datetime.timezone.utc)
                      .isoformat(timespec="seconds"))
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")

    # batch i of every length before batch i + 1 of any, so that a run cut by --time-budget
    # still covers every length
    per_length = []
    for length in args.lengths:
        selected = [p for p in tasks.select(prompts, length, args.needles, args.windows, args.texts)
                    if p.kind == "text" or p.kind in args.needle_kinds]
        if not selected:
            raise SystemExit(f"no prompts of length {length} in {args.prompts}")
        per_length.append([(length, b) for b in batches(selected, args.batch, args.mix_kinds)])
    jobs = [job for group in itertools.zip_longest(*per_length) for job in group if job]
    started = time.time()
    for length, batch in jobs:
        if args.time_budget is not None and time.time() - started > args.time_budget:
            print(f"time budget {args.time_budget:.0f}s spent: stopping before [{length}] "
                  f"{batch[0].name}", flush=True)
            return
        t0 = time.time()
        dense_logits, dense_ids = forward(model, "sdpa", batch)
        wall = (time.time() - t0) / len(batch)
        dense_text = [tokenizer.decode(a) for a in dense_ids]
        for p, logits, text in zip(batch, dense_logits, dense_text):
            nxt = p.tokens[p.eval_rows + 1]
            m = tasks.compare_logits(logits, logits, nxt)
            emit(_base(p, length) | dict(config="dense", backend="dense", wall_s=wall,
                                         answer=text, correct=_correct(p, text),
                                         nll=m["nll_dense"], n=m["n"]))
        print(f"[{length}] {batch[0].name} +{len(batch) - 1} dense {wall:.1f}s/prompt "
              f"{[_correct(p, t) for p, t in zip(batch, dense_text)]}", flush=True)
        for backend, attn, cfg in configs:
            if backend != "fp" and batch[0].kind != "text" and not args.rule_needles:
                continue
            recorder.reset()
            t0 = time.time()
            logits, ids = forward(model, attn, batch)
            wall = (time.time() - t0) / len(batch)
            stats = recorder.summary()
            texts = [tokenizer.decode(a) for a in ids]
            for p, d, s, text in zip(batch, dense_logits, logits, texts):
                m = tasks.compare_logits(d, s, p.tokens[p.eval_rows + 1])
                emit(_base(p, length) | dict(config=cfg.label, backend=backend,
                                             **cfg.kwargs(), attn_dtype=cfg.attn_dtype(dtype),
                                             wall_s=wall, answer=text,
                                             correct=_correct(p, text), **m, **stats))
            print(f"[{length}] {batch[0].name} +{len(batch) - 1} {attn} {wall:.1f}s/prompt "
                  f"density {stats['density']:.3f} "
                  f"{[_correct(p, t) for p, t in zip(batch, texts)]}", flush=True)


def _base(p, length):
    return {"length": length, "prompt": p.name, "kind": p.kind, "depth": p.depth,
            "answers": list(p.answers)}


def _correct(p, text):
    return tasks.needle_correct(p.kind, text, p.answers) if p.answers else None


if __name__ == "__main__":
    main()
