"""flashprefill's vLLM backend in a real vLLM engine on the CPU, against vLLM's own CPU_ATTN.

    python scripts/vllm/engine_test.py MODEL_DIR [--work DIR]

Runs one engine per configuration, each in its own process (vLLM's in-process engine core, so
the attention layers can be observed): the stock backend, flashprefill at alpha = 0,
flashprefill at its default selection, and the same with kept means (FLASHPREFILL_KEEP_MEANS);
then, with a bfloat16 model and kv_cache_dtype "fp8", the stock backend (on x86 with AVX-512 or
AMX, which vLLM's CPU FP8 cache needs) and flashprefill at alpha = 0 (stock-fp8,
flashprefill-fp8). Every engine gets the same workload: a warm-up prompt,
then three prompts submitted together (two share the warm-up's 1024-token prefix, so prefix
caching serves it; 1K-3K tokens each), chunked prefill with max_num_batched_tokens = 512 so
prompts split into chunks that extend a cached prefix, block size 32, greedy decoding of
DECODE_TOKENS tokens with the chosen token's log-probability.

Checks (exit status 1 when one fails):
  * alpha = 0: the same tokens as the stock backend and log-probabilities within float32 noise
    (LOGPROB_TOLERANCE);
  * one layer's attention output, for every prefill and extend request of every forward,
    against exact float64 attention over keys and values read back from the paged cache with
    torch indexing (alpha = 0: within FLOAT32_TOLERANCE), and against the library's
    contiguous call on those keys (both configurations: within FLOAT32_TOLERANCE);
  * prefix caching served the shared prefix and prefill ran in chunks that extend a prefix;
  * kept means: the same tokens and log-probabilities as the default selection, bit for bit;
    the checked layer's output, in every forward, equal to the same forward pooling every
    block from scratch (the rebuild), bit for bit; and chunks did take pooled keys from the
    kept means (earlier chunks, the shared prefix);
  * fp8: the layer against the library's contiguous call on the e4m3 keys and values read back
    from the cache with the layer's scales (within FLOAT32_TOLERANCE) and against exact float64
    attention on the dequantized cache, q quantized as the library does (relative L2 within
    FP8_TOLERANCE); the first token of every prompt equal to stock-fp8's.
Reported: token agreement and log-probability differences at the default selection, the
error against exact attention there, and how fragmented the block tables were (the share of
128-key spans whose blocks lie in consecutive pool rows, over every request of every forward).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

DECODE_TOKENS = 16
PLUGIN = "flashprefill.vllm:register"
PREFIX_TOKENS = 1024
CHECK_LAYER = 1
BLOCK_SIZE = 32  # the smallest CPU_ATTN takes (a multiple of 32)
LOGPROB_TOLERANCE = 2e-3
FLOAT32_TOLERANCE = 1e-4
# docs/ALGORITHM.md "FP8 e4m3", Tolerances: the library's FP8 attention against float64
# attention on its dequantized inputs (relative L2).
FP8_TOLERANCE = 3e-2
# flashprefill-fp8 against stock-fp8 (vLLM's CPU_ATTN over its own FP8 cache), both bfloat16
# models with exact attention over an e4m3 cache whose scales are 1 (no calibrated scales in
# the checkpoint), which round differently: CPU_ATTN's cache write truncates the mantissa, where
# the cache update here rounds to nearest (as vLLM's CUDA reshape_and_cache_flash does) and the
# library also rounds q and the probabilities to e4m3 (Eq. 15). Their greedy continuations part
# at the first near-tie, and where that falls depends on CPU_ATTN's kernel for the host's ISA
# (AVX-512 or AMX): 44 of 64 tokens agreed on one host, 23 of 64 on another, parting after 3 or
# 4 tokens. The first token of every prompt is decided by the prefill alone: it must agree.
# Both FP8 runs' agreement with the bfloat16 model over an unquantized cache is printed beside.

CONFIGS = {
    "stock": {},
    "flashprefill-alpha0": {"FLASHPREFILL_VLLM_CPU": "1", "FLASHPREFILL_ALPHA": "0",
                            "FLASHPREFILL_MIN_SPARSE_LEN": "0"},
    "flashprefill-default": {"FLASHPREFILL_VLLM_CPU": "1"},
    "flashprefill-kept-means": {"FLASHPREFILL_VLLM_CPU": "1", "FLASHPREFILL_KEEP_MEANS": "1"},
    "stock-fp8": {},
    "flashprefill-fp8": {"FLASHPREFILL_VLLM_CPU": "1", "FLASHPREFILL_ALPHA": "0",
                         "FLASHPREFILL_MIN_SPARSE_LEN": "0"},
}
# Configurations compared with another than "stock".
REFERENCE = {"flashprefill-fp8": "stock-fp8"}
# The engine's dtype and KV cache dtype per configuration (float32 and the model's dtype
# otherwise): an FP8 KV cache needs a bfloat16 or float16 model.
ENGINE_ARGS = {"stock-fp8": dict(dtype="bfloat16", kv_cache_dtype="fp8"),
               "flashprefill-fp8": dict(dtype="bfloat16", kv_cache_dtype="fp8")}


def facts(tokenizer, seed, count):
    """Token ids of `count` tokens of numbered facts (a retrieval-style document)."""
    import random
    rng = random.Random(seed)
    words = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor",
             "indigo", "juniper", "kelp", "lagoon", "marble", "nectar", "onyx", "prairie"]
    ids, n = [], 0
    while len(ids) < count:
        line = (f"Record {seed}-{n}: the {rng.choice(words)} vault holds code "
                f"{rng.randrange(10000, 99999)} and the {rng.choice(words)} key.\n")
        ids += tokenizer.encode(line, add_special_tokens=False)
        n += 1
    return ids[:count]


def prompts(tokenizer):
    question = tokenizer.encode("\nQuestion: which code does the amber vault hold? Answer:",
                                add_special_tokens=False)
    prefix = facts(tokenizer, 1, PREFIX_TOKENS)
    warmup = prefix + facts(tokenizer, 2, 200) + question
    batch = [prefix + facts(tokenizer, 3, 1000) + question,
             prefix + facts(tokenizer, 4, 2000) + question,
             facts(tokenizer, 5, 1200) + question]
    return warmup, batch


class LayerCheck:
    """Observes one attention layer of the flashprefill CPU backend (see the module docstring)."""

    def __init__(self, layer_name):
        self.layer_name = layer_name
        self.worst = {"exact": 0.0, "library": 0.0, "rebuilt": 0.0, "exact_rel_l2": 0.0}
        self.rows = 0
        self.extend_requests = 0
        self.spans = [0, 0]
        self.kept_keys = [0, 0]  # keys of filled blocks taken from the kept means, of all

    def install(self):
        from flashprefill.vllm import backend
        original = backend.FlashPrefillCPUImpl.forward
        check = self

        def forward(impl, layer, query, key, value, kv_cache, attn_metadata, output, *args,
                    **kwargs):
            observed = (attn_metadata is not None and
                        getattr(layer, "layer_name", "") == check.layer_name)
            if observed:
                check.count_kept(impl, kv_cache, attn_metadata.batch)
            result = original(impl, layer, query, key, value, kv_cache, attn_metadata, output,
                              *args, **kwargs)
            if observed:
                check.observe(impl, layer, query, kv_cache, attn_metadata.batch, output)
            return result

        backend.FlashPrefillCPUImpl.forward = forward

    def count_kept(self, impl, kv_cache, batch):
        """Before the layer runs: the keys its sparse requests will take from the kept means."""
        from flashprefill.vllm import batch as vb
        kept = impl.kept_means
        block = batch.settings.block_size
        for part in batch.parts:
            if part.dense:
                continue
            filled = batch.seq_lens_host[part.requests] // block * block
            self.kept_keys[1] += int(filled.sum())
            if kept is not None and kept.fits(vb.kv_views(kv_cache, impl.head_size)[0]):
                rows = part.mean_rows(kept, -(-part.max_seqlen_k // block))
                self.kept_keys[0] += int(kept.gather(rows)[1].sum())

    def observe(self, impl, layer, query, kv_cache, batch, output):
        import torch

        import flashprefill as fp
        from flashprefill.vllm import batch as vb
        key_cache, value_cache = vb.kv_views(kv_cache, impl.head_size)
        if impl.kept_means is not None:  # the same forward, every block pooled from scratch
            rebuilt = output.clone()
            batch.run(query, key_cache, value_cache, rebuilt, impl.scale)
            self.worst["rebuilt"] = max(self.worst["rebuilt"],
                                        float((rebuilt - output).abs().max()))
        block_size = key_cache.shape[1]
        consecutive, total = vb.consecutive_span_share(batch.block_table, batch.seq_lens_host,
                                                       block_size)
        self.spans[0] += consecutive
        self.spans[1] += total
        sparse = {int(r) for p in batch.parts if not p.dense for r in p.requests}
        group = impl.num_heads // impl.num_kv_heads
        for r in range(batch.num_decodes, batch.num_reqs):
            len_q, len_kv = int(batch.lens_q[r]), int(batch.seq_lens_host[r])
            if len_q == 0:
                continue
            self.extend_requests += len_kv > len_q
            start = int(batch.starts[r])
            blocks = batch.block_table[r, :-(-len_kv // block_size)].long()
            k = key_cache[blocks].reshape(-1, impl.num_kv_heads, impl.head_size)[:len_kv]
            v = value_cache[blocks].reshape(-1, impl.num_kv_heads, impl.head_size)[:len_kv]
            q = query[start:start + len_q]
            got = output[start:start + len_q].double()
            q64, k64, v64 = q.double(), k.double(), v.double()
            descales = {}
            if impl.fp8:  # the cache's dequantized values; q as the library quantizes it
                descales = dict(k_descale=layer._k_scale, v_descale=layer._v_scale)
                k64, v64 = k64 * float(layer._k_scale), v64 * float(layer._v_scale)
                grouped = q.float().unflatten(1, (impl.num_kv_heads, group))
                c_q = grouped.abs().amax(dim=(0, 2, 3), keepdim=True) / 448
                q8 = (grouped * (1 / c_q)).clamp(-448, 448).to(torch.float8_e4m3fn)
                q64 = (q8.double() * c_q.double()).flatten(1, 2)
            scores = torch.einsum("qhd,khd->hqk", q64,
                                  k64.repeat_interleave(group, dim=1)) * impl.scale
            visible = (torch.arange(len_kv)[None, :] <=
                       (len_kv - len_q + torch.arange(len_q))[:, None])
            scores = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
            exact = torch.einsum("hqk,khd->qhd", scores, v64.repeat_interleave(group, dim=1))
            if r in sparse:
                s = batch.settings
                library = fp.prefill(q, k.contiguous(), v.contiguous(), softmax_scale=impl.scale,
                                     block_size=s.block_size, alpha=s.alpha,
                                     sink_tokens=s.sink_tokens, window_tokens=s.window_tokens,
                                     dense_recent_tiles=s.dense_recent_tiles,
                                     mean_correction=s.mean_correction, **descales)
            else:
                library = fp.dense_attention(q, k.contiguous(), v.contiguous(),
                                             softmax_scale=impl.scale, **descales)
            self.worst["exact"] = max(self.worst["exact"], float((got - exact).abs().max()))
            self.worst["exact_rel_l2"] = max(self.worst["exact_rel_l2"], float(
                (got - exact).norm() / exact.norm()))
            self.worst["library"] = max(self.worst["library"],
                                        float((got - library.double()).abs().max()))
            self.rows += len_q

    def report(self):
        return {"max_abs_error_vs_exact": self.worst["exact"],
                "max_rel_l2_vs_exact": self.worst["exact_rel_l2"],
                "max_abs_error_vs_library_contiguous": self.worst["library"],
                "max_abs_diff_vs_rebuilt": self.worst["rebuilt"],
                "rows_checked": self.rows, "extend_requests_checked": self.extend_requests,
                "consecutive_spans": self.spans[0], "spans": self.spans[1],
                "kept_keys_taken": self.kept_keys[0], "filled_keys": self.kept_keys[1]}


def run_engine(model, config, out_path):
    """One engine, one configuration (the environment already holds its settings)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM loads the plugin itself when the installed package declares its entry point;
    # otherwise register() does the same by hand.
    from importlib.metadata import entry_points
    plugins = entry_points(group="vllm.general_plugins")
    registered_by = "entry point"
    if not any(ep.value == PLUGIN for ep in plugins):
        import flashprefill.vllm
        flashprefill.vllm.register()
        registered_by = "flashprefill.vllm.register()"
    check = None
    if config.startswith("flashprefill"):
        check = LayerCheck(f"model.layers.{CHECK_LAYER}.self_attn.attn")
        check.install()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.time()
    engine_args = ENGINE_ARGS.get(config, dict(dtype="float32"))
    llm = LLM(model=model, **engine_args, block_size=BLOCK_SIZE, enable_prefix_caching=True,
              enable_chunked_prefill=True, max_num_batched_tokens=512, max_num_seqs=8,
              max_model_len=4096, enforce_eager=True, seed=0)
    loaded = time.time()
    tokenizer = llm.get_tokenizer()
    warmup, batch = prompts(tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, logprobs=1,
                            ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=warmup)], params, use_tqdm=False)
    outputs += llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params,
                            use_tqdm=False)
    result = {"config": config, "registered_by": registered_by, "load_s": loaded - started, "generate_s": time.time() - loaded,
              "prompt_tokens": [len(o.prompt_token_ids) for o in outputs],
              "cached_tokens": [o.num_cached_tokens for o in outputs],
              "tokens": [], "logprobs": []}
    for o in outputs:
        c = o.outputs[0]
        result["tokens"].append(list(c.token_ids))
        result["logprobs"].append([lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)])
    if check is not None:
        result["layer_check"] = check.report()
    pathlib.Path(out_path).write_text(json.dumps(result))


def compare(stock, other):
    agree = total = 0
    worst = 0.0
    first_divergence = []
    for a, b, la, lb in zip(stock["tokens"], other["tokens"], stock["logprobs"],
                            other["logprobs"]):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        first_divergence.append(same)
        agree += sum(x == y for x, y in zip(a, b))
        total += len(a)
        # log-probabilities compare only while the sequences agree (same context)
        worst = max([worst] + [abs(x - y) for x, y in zip(la[:same], lb[:same])])
    return {"token_agreement": agree / total, "first_divergence": first_divergence,
            "max_logprob_diff_while_equal": worst}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--work", default="out/vllm")
    parser.add_argument("--engine", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        run_engine(args.model, args.engine, args.result)
        return 0
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    import torch
    # vLLM's CPU_ATTN takes an FP8 cache on x86 with AVX-512 or AMX only (vllm's
    # cpu_attn._get_attn_isa); elsewhere flashprefill-fp8 runs without that comparison.
    stock_fp8 = torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()
    for name, env in CONFIGS.items():
        if name == "stock-fp8" and not stock_fp8:
            print("stock-fp8: not run: vLLM's CPU FP8 KV cache needs AVX-512 or AMX")
            continue
        path = work / f"{name}.json"
        started = time.time()
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHPREFILL_")
                     or k == "FLASHPREFILL_LIB"}
        subprocess.run([sys.executable, __file__, args.model, "--engine", name, "--result",
                        str(path)], env=dict(child_env, **env), check=True)
        results[name] = json.loads(path.read_text())
        r = results[name]
        print(f"{name}: backend registered by {r['registered_by']}; "
              f"{time.time() - started:.0f} s (engine load {r['load_s']:.0f} s, generate "
              f"{r['generate_s']:.0f} s); prompt tokens {r['prompt_tokens']}, served from the "
              f"prefix cache {r['cached_tokens']}", flush=True)
    failures = []
    for name in ("flashprefill-alpha0", "flashprefill-default", "flashprefill-kept-means",
                 "flashprefill-fp8"):
        reference = REFERENCE.get(name, "stock")
        r, lc = results[name], results[name]["layer_check"]
        if reference in results:
            c = compare(results[reference], r)
            print(f"{name} vs {reference}: token agreement {c['token_agreement']:.3f}, first "
                  f"divergence per prompt {c['first_divergence']} of {DECODE_TOKENS}, max "
                  f"|logprob diff| while equal {c['max_logprob_diff_while_equal']:.2e}")
        print(f"  layer {CHECK_LAYER} ({lc['rows_checked']} prefill rows, "
              f"{lc['extend_requests_checked']} extend requests): max |out - exact| "
              f"{lc['max_abs_error_vs_exact']:.2e} (relative L2 {lc['max_rel_l2_vs_exact']:.2e}), "
              f"max |out - library contiguous| {lc['max_abs_error_vs_library_contiguous']:.2e}")
        print(f"  block tables: {lc['consecutive_spans']} of {lc['spans']} 128-key spans in "
              f"consecutive pool rows ({lc['consecutive_spans'] / max(lc['spans'], 1):.1%})")
        if name == "flashprefill-kept-means":
            same = compare(results["flashprefill-default"], r)
            print(f"  kept means: {lc['kept_keys_taken']} of {lc['filled_keys']} keys of filled "
                  f"blocks taken from the kept means; max |out - rebuilt| "
                  f"{lc['max_abs_diff_vs_rebuilt']:.2e}; vs flashprefill-default: token "
                  f"agreement {same['token_agreement']:.3f}, max |logprob diff| "
                  f"{same['max_logprob_diff_while_equal']:.2e}")
            if lc["max_abs_diff_vs_rebuilt"] != 0.0:
                failures.append("kept means: layer output differs from pooling every block")
            if lc["kept_keys_taken"] == 0:
                failures.append("kept means: no chunk took pooled keys from the kept means")
            if same["token_agreement"] != 1.0 or same["max_logprob_diff_while_equal"] != 0.0:
                failures.append("kept means: tokens or log-probabilities differ from "
                                "flashprefill-default")
        if lc["max_abs_error_vs_library_contiguous"] > FLOAT32_TOLERANCE:
            failures.append(f"{name}: layer output differs from the library's contiguous call")
        if lc["extend_requests_checked"] == 0:
            failures.append(f"{name}: no prefill chunk extended a cached prefix")
        if name == "flashprefill-alpha0":
            if c["token_agreement"] != 1.0:
                failures.append("alpha = 0: tokens differ from the stock backend")
            if c["max_logprob_diff_while_equal"] > LOGPROB_TOLERANCE:
                failures.append(f"alpha = 0: log-probabilities differ by more than "
                                f"{LOGPROB_TOLERANCE}")
            if lc["max_abs_error_vs_exact"] > FLOAT32_TOLERANCE:
                failures.append("alpha = 0: layer output is not exact attention")
        if name == "flashprefill-fp8":
            if lc["max_rel_l2_vs_exact"] > FP8_TOLERANCE:
                failures.append(f"fp8: layer output is farther than {FP8_TOLERANCE} (relative "
                                f"L2) from exact attention on the dequantized cache")
            if reference in results and min(c["first_divergence"]) < 1:
                failures.append(f"fp8: the first token of a prompt differs from {reference}'s")
            for n in (reference, name):
                if n in results and "stock" in results:
                    print(f"  {n} vs stock (bfloat16 cache): token agreement "
                          f"{compare(results['stock'], results[n])['token_agreement']:.3f}")
    if min(results["stock"]["cached_tokens"][1:3]) < PREFIX_TOKENS - 16:
        failures.append("prefix caching did not serve the shared prefix")
    for f in failures:
        print("FAILED:", f)
    print("vLLM engine test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
