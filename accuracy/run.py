"""Accuracy study driver: dense vs flashprefill prefill in every layer of SmolLM2-135M-Instruct.

For each length, builds the prompts (language-model windows of real text and needle prompts), runs
the dense model once per prompt (cached under accuracy/.cache), then every sparse configuration of the
grid, and appends one JSON line per (prompt, configuration) to --out. Decode stays dense.

    python3 accuracy/run.py --lengths 2048 4096 --alphas 0.05 0.1 0.2 0.4 --out accuracy/results/x.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import corpus                                      # noqa: E402
import device_pack                                 # noqa: E402
import tasks                                       # noqa: E402
from attention import LayerRecorder, SparseConfig, make_sparse_hook, sparse_backend  # noqa: E402
from gguf_weights import load_model                # noqa: E402
from model import Llama, Ops                       # noqa: E402
from tokenizer import ByteLevelBPE                 # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF, or a directory made by device_pack.py (default: pinned package)")
    p.add_argument("--tokens", help="token pack .npz (device runs); default: tokenize the corpora here")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--alphas", type=float, nargs="+", default=[0.1])
    p.add_argument("--block-sizes", type=int, nargs="+", default=[128])
    p.add_argument("--corrections", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument("--lm-texts", nargs="*", default=["kjv", "code"], choices=list(corpus.TEXTS))
    p.add_argument("--needle-kinds", nargs="*", default=["single", "multikey"])
    p.add_argument("--depths", type=float, nargs="*", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--backend", nargs="+", default=["fp"],
                   help="one or more of: fp (the library), reference (numpy model of docs/ALGORITHM.md) or tv-<rule> "
                        "(torch selection variants, GPU: tv-paper, tv-rownorm, tv-perhead, tv-oracle)")
    p.add_argument("--attn-dtype", choices=["bfloat16", "float16"], default="bfloat16",
                   help="dtype the library's CUDA path gets q/k/v in (the model runs in float32)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no new prompt after this (language-model windows run first)")
    p.add_argument("--layer-errors", action="store_true",
                   help="record per-layer density/error on the language-model windows")
    p.add_argument("--cpu", action="store_true", help="numpy even when torch sees a GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON lines file (appended)")
    return p.parse_args(argv)


def build_prompts(args, tokenizer, length, token_pack):
    prompts = [tasks.lm_prompt(name, corpus.tokens(name, length, tokenizer, token_pack))
               for name in args.lm_texts]
    haystack = corpus.tokens("kjv", length, tokenizer, token_pack)
    for depth in args.depths:
        for kind in args.needle_kinds:
            # one seed per (length, kind, depth): the same keys for every configuration
            tag = f"{args.seed}/{length}/{kind}/{depth}".encode()
            rng = np.random.default_rng(int.from_bytes(hashlib.sha256(tag).digest()[:8], "little"))
            prompts.append(tasks.needle_prompt(tokenizer, haystack, length, kind, depth, rng))
    return prompts


def run_prompt(model, tokenizer, prompt, hook):
    t0 = time.time()
    if prompt.answer is not None:
        answer_ids, hidden = model.greedy(prompt.tokens, tasks.ANSWER_TOKENS, hook)
    else:
        answer_ids, (hidden, _) = [], model.prefill(prompt.tokens, hook)
    # on the GPU the logits stay there (metrics in float64 on the device); numpy on the CPU
    logits = model.logits(hidden, prompt.eval_rows, to_host=model.ops.torch is None)
    return logits, answer_ids, time.time() - t0


def dense_baseline(model, tokenizer, prompt, length, model_tag):
    if model.ops.torch is not None:            # cheap on a GPU: no disk cache
        logits, answer, wall = run_prompt(model, tokenizer, prompt, None)
        return logits, answer, wall, False
    digest = hashlib.sha256(np.asarray(prompt.tokens, np.int64).tobytes()).hexdigest()[:16]
    path = os.path.join(HERE, ".cache", f"dense-{model_tag}-{length}-{digest}.npz")
    if os.path.exists(path):
        z = np.load(path)
        return z["logits"], z["answer"].tolist(), float(z["wall"]), True
    logits, answer, wall = run_prompt(model, tokenizer, prompt, None)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, logits=logits, answer=np.asarray(answer, np.int64), wall=wall)
    return logits, answer, wall, False


def main(argv=None):
    args = parse_args(argv)
    ops = Ops.pick(prefer_gpu=not args.cpu)
    if args.model and os.path.isdir(args.model):
        config, weights, tables = device_pack.load_pack(args.model)
    else:
        config, weights, tables = load_model(args.model)
    tokenizer = ByteLevelBPE(tables)
    model = Llama(config, weights, ops)
    del weights
    token_pack = corpus.load_token_pack(args.tokens) if args.tokens else None
    backends = {name: sparse_backend(name) for name in args.backend}
    model_tag = ops.name
    # alpha 0 selects every block (dense through the same kernels): correction has nothing to add
    grid = [SparseConfig(alpha=a, block_size=bs, mean_correction=(c == "on"))
            for bs, a, c in itertools.product(args.block_sizes, args.alphas, args.corrections)
            if not (a == 0 and c == "on" and "off" in args.corrections)]
    # the library's CUDA path takes bfloat16 / float16; the CPU path and the torch variants float32
    hook_dtypes = {name: "float32" if ops.torch is None or not name == "fp" else args.attn_dtype
                   for name in backends}
    started = time.time()
    command = "python3 accuracy/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    device_name = ops.name
    if ops.torch is not None:
        device_name += f" ({ops.torch.cuda.get_device_name()})"

    def emit(record):
        record.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      device=device_name, command=command)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")

    # language-model windows of every length first, then the needles depth by depth, so that a run
    # cut by --time-budget still covers every length
    depth_rank = {f"{d:.2f}": i for i, d in enumerate(args.depths)}
    jobs = [(length, p) for length in args.lengths
            for p in build_prompts(args, tokenizer, length, token_pack)]
    jobs = ([j for j in jobs if j[1].answer is None]
            + sorted((j for j in jobs if j[1].answer is not None),
                     key=lambda j: (depth_rank[j[1].name.split("/d")[1]], j[0])))
    for length, prompt in jobs:
        if args.time_budget is not None and time.time() - started > args.time_budget:
            print(f"time budget {args.time_budget:.0f}s spent: stopping before [{length}] "
                  f"{prompt.name}", flush=True)
            break
        next_tokens = np.asarray(prompt.tokens)[prompt.eval_rows + 1]
        d_logits, d_answer, d_wall, cached = dense_baseline(model, tokenizer, prompt, length, model_tag)
        base = {"length": length, "prompt": prompt.name, "answer_key": prompt.answer}
        d_metrics = tasks.compare_logits(d_logits, d_logits, next_tokens)
        emit(dict(base, config="dense", backend="dense", wall_s=d_wall, cached=cached,
                  answer=tokenizer.decode(d_answer),
                  correct=(tasks.needle_correct(tokenizer, d_answer, prompt.answer)
                           if prompt.answer else None),
                  nll=d_metrics["nll_dense"], n=d_metrics["n"]))
        print(f"[{length}] {prompt.name:24s} dense   wall {d_wall:6.1f}s "
              f"answer {tokenizer.decode(d_answer)!r}", flush=True)
        for (backend, prefill_fn), cfg in itertools.product(backends.items(), grid):
            hook_dtype = hook_dtypes[backend]
            recorder = LayerRecorder(config.n_layers)
            layer_errors = args.layer_errors and prompt.answer is None
            hook = make_sparse_hook(ops, prefill_fn, cfg, model.scale, recorder, layer_errors,
                                    hook_dtype)
            logits, answer, wall = run_prompt(model, tokenizer, prompt, hook)
            metrics = tasks.compare_logits(d_logits, logits, next_tokens)
            summary = recorder.summary()
            if not layer_errors:
                summary.pop("rel_err_per_layer")
            emit(dict(base, config=cfg.label, backend=backend, attn_dtype=hook_dtype,
                      **cfg.kwargs(), wall_s=wall,
                      answer=tokenizer.decode(answer),
                      correct=(tasks.needle_correct(tokenizer, answer, prompt.answer)
                               if prompt.answer else None),
                      **metrics, **summary))
            print(f"[{length}] {prompt.name:24s} {backend:10s} {cfg.label:18s} wall {wall:6.1f}s "
                  f"density {summary['density']:.3f} top1 {metrics['top1_agree']:.4f} "
                  f"kl {metrics['kl_mean']:.2e} answer {tokenizer.decode(answer)!r}", flush=True)


if __name__ == "__main__":
    main()
