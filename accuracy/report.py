"""Tables (markdown) and the alpha plot from the JSON lines written by run.py.

    python3 accuracy/report.py accuracy/results/*.jsonl --out docs
writes docs/accuracy_vs_alpha.png and accuracy/results/tables.md (pasted into docs/ACCURACY.md).
Records of the torch selection variants (backend tv-<rule>, selection_variants.py) go to their own
table and to docs/selection_rules.png; every other table is the library's (or the numpy reference's).
Alpha 0 (every block selected: dense through the library, in its dtype) is the precision floor: a
row of the tables, a dotted line in the plot.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os

import numpy as np

DEFAULT = "a0.1-bs128-corr"


def load(paths):
    records = []
    for path in paths:
        with open(path) as f:
            records += [dict(json.loads(line), file=os.path.basename(path)) for line in f if line.strip()]
    # a dense baseline appears once per phase that used the prompt: keep one per (length, prompt)
    seen, unique = set(), []
    for r in records:
        key = (r["length"], r["prompt"], r["config"], r.get("backend"),
               r["file"] if r["config"] != "dense" else "")
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def split_variants(records):
    """-> (library/reference records with the dense baselines, variant records)."""
    variants = [r for r in records if str(r.get("backend", "")).startswith("tv-")]
    return [r for r in records if r not in variants], variants


def variant_table(records):
    """Per length, rule and alpha over the language-model windows: density, pair density, top-1, KL."""
    if not records:
        return ""
    out = ["| length | rule | alpha | correction | density (tiles) | density (pairs) | top-1 agreement | "
           "KL(dense‖sparse) | positions |", "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    groups = collections.defaultdict(list)
    for r in records:
        groups[(r["length"], r["backend"][3:], r["alpha"], r["mean_correction"])].append(r)
    for (length, rule, alpha, corr), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], not kv[0][3])):
        top1, kl, n = pooled(rs)
        out.append(f"| {length} | {rule} | {alpha:g} | {'on' if corr else 'off'} | "
                   f"{np.mean([r['density'] for r in rs]):.3f} | "
                   f"{np.mean([r.get('pair_density', np.nan) for r in rs]):.3f} | {100 * top1:.2f} % | "
                   f"{kl:.2e} | {n} |")
    return "\n".join(out) + "\n"


def plot_variants(records, path):
    """Top-1 agreement against pair density, one line per rule, one panel per length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["length"] for r in records})
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.3 * len(lengths), 4.4), squeeze=False)
    markers = {"paper": "o", "rownorm": "s", "perhead": "^", "oracle": "*"}
    for ax, length in zip(axes[0], lengths):
        for rule in sorted({r["backend"][3:] for r in records}):
            for corr in (True, False):
                rs = [r for r in records if r["length"] == length and r["backend"] == "tv-" + rule
                      and r["mean_correction"] == corr]
                alphas = sorted({r["alpha"] for r in rs})
                if not alphas:
                    continue
                xs, ys = [], []
                for a in alphas:
                    cfg = [r for r in rs if r["alpha"] == a]
                    xs.append(100 * np.mean([r["pair_density"] for r in cfg]))
                    ys.append(100 * pooled(cfg)[0])
                ax.plot(xs, ys, marker=markers.get(rule, "x"), ls="-" if corr else "--",
                        label=f"{rule} corr {'on' if corr else 'off'}")
        ax.axhline(99, color="k", lw=1, ls=":")
        ax.set_xlabel("density (% of causal query-key pairs computed)")
        ax.set_ylabel("top-1 agreement with dense (%)")
        ax.set_title(f"{length} tokens (language-model windows)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct: selection rules at equal density (torch, float32)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def provenance(records):
    """'date range; commands' lines for a table."""
    dates = sorted(r["date"] for r in records)
    commands = sorted({r["command"] for r in records if r["config"] != "dense"})
    lines = [f"Measured {dates[0]} – {dates[-1]} on {records[0]['device']}; made by:"]
    lines += [f"`{c}`" for c in commands]
    return "\n".join(lines) + "\n"


def sparse_configs(records):
    cfgs = {(r["block_size"], r["alpha"], r["mean_correction"]) for r in records if r["config"] != "dense"}
    return sorted(cfgs, key=lambda c: (-c[0], c[1], not c[2]))


def label(bs, alpha, corr):
    return f"a{alpha:g}-bs{bs}-{'corr' if corr else 'nocorr'}"


def pooled(rs):
    """top-1 agreement and mean KL pooled over prompts, weighted by scored positions."""
    n = sum(r["n"] for r in rs)
    return (sum(r["top1_agree"] * r["n"] for r in rs) / n, sum(r["kl_mean"] * r["n"] for r in rs) / n, n)


def perplexity_table(records):
    rows = [r for r in records if r["config"] == "dense" and r["prompt"].startswith("lm/")]
    out = ["| length | text | scored positions | dense perplexity |", "| ---: | --- | ---: | ---: |"]
    for r in sorted(rows, key=lambda r: (r["length"], r["prompt"])):
        out.append(f"| {r['length']} | {r['prompt'][3:]} | {r['n']} | {math.exp(r['nll']):.2f} |")
    return "\n".join(out) + "\n"


def common_prompts(records, length, configs):
    """Prompts of `length` that every configuration in `configs` ran: rows compare like with like."""
    sets = [{r["prompt"] for r in records if r["length"] == length and r["config"] == label(*c)}
            for c in configs]
    return set.intersection(*sets) if sets else set()


def sweep_groups(records):
    """(length, block size, configurations, common prompts) for every length and block size."""
    for length in sorted({r["length"] for r in records}):
        at_length = [r for r in records if r["length"] == length]
        for bs in sorted({c[0] for c in sparse_configs(at_length)}, reverse=True):
            cfgs = [c for c in sparse_configs(at_length) if c[0] == bs]
            yield length, bs, cfgs, common_prompts(records, length, cfgs)


def config_rows(records, length, configs, prompts):
    """One table row per configuration over exactly `prompts`."""
    rs = [r for r in records if r["length"] == length and r["prompt"] in prompts]
    dense = {r["prompt"]: r for r in rs if r["config"] == "dense"}
    rows = []
    for bs, alpha, corr in configs:
        cfg = [r for r in rs if r["config"] == label(bs, alpha, corr)]
        top1, kl, n = pooled(cfg)
        needles = [r for r in cfg if r["answer_key"]]
        nd = sum(dense[r["prompt"]]["correct"] for r in needles)
        nf = sum(r["correct"] for r in needles)
        lm = [r for r in cfg if not r["answer_key"]]
        ppl = "–"
        if lm:
            ppl = (f"{math.exp(np.mean([r['nll_dense'] for r in lm])):.3f} → "
                   f"{math.exp(np.mean([r['nll_sparse'] for r in lm])):.3f}")
        needle_cells = (f"{nd}/{len(needles)}", f"{nf}/{len(needles)}") if needles else ("–", "–")
        rows.append(f"| {length} | {label(bs, alpha, corr)} | {np.mean([r['density'] for r in cfg]):.3f} | "
                    f"{100 * top1:.2f} % | {kl:.2e} | {n} | {needle_cells[0]} | {needle_cells[1]} | {ppl} |")
    return rows


TABLE_HEAD = ["| length | config | density | top-1 agreement | KL(dense‖fp) | positions | needles dense | "
              "needles fp | ppl dense → fp (text windows) |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]


def default_table(records):
    """The paper's default with and without correction, every prompt run at each length."""
    out = list(TABLE_HEAD)
    for length in sorted({r["length"] for r in records}):
        cfgs = [(128, 0.1, True), (128, 0.1, False)]
        prompts = common_prompts(records, length, cfgs)
        if prompts:
            out += config_rows(records, length, cfgs, prompts)
    return "\n".join(out) + "\n"


def sweep_tables(records):
    parts = []
    for length, bs, cfgs, prompts in sweep_groups(records):
        if not prompts:
            continue
        parts.append(f"**{length} tokens, block size {bs}** — prompts: {', '.join(sorted(prompts))}\n")
        parts.append("\n".join(TABLE_HEAD + config_rows(records, length, cfgs, prompts)) + "\n")
    return "\n".join(parts)


def needle_detail(records):
    rs = [r for r in records if r["answer_key"]]
    configs = ["dense"] + [label(*c) for c in sparse_configs(rs)]
    cells = collections.defaultdict(dict)
    for r in rs:
        cells[(r["length"], r["prompt"])][r["config"]] = "✓" if r["correct"] else "✗"
    out = ["| length | needle | " + " | ".join(configs) + " |", "| ---: | --- |" + " :---: |" * len(configs)]
    for (length, prompt), row in sorted(cells.items()):
        out.append(f"| {length} | {prompt[7:]} | " + " | ".join(row.get(c, "") for c in configs) + " |")
    return "\n".join(out) + "\n"


def per_layer_table(records, length, prompt="lm/kjv"):
    rs = [r for r in records if r["length"] == length and r["prompt"] == prompt and "rel_err_per_layer" in r]
    if not rs:
        return ""
    cfgs = [c for c in sparse_configs(rs) if c[0] == 128]
    by = {label(*c): next(r for r in rs if r["config"] == label(*c)) for c in cfgs}
    head = "| layer | " + " | ".join(f"{k} density | {k} error" for k in by) + " |"
    out = [head, "| ---: |" + " ---: | ---: |" * len(by)]
    for layer in range(len(next(iter(by.values()))["density_per_layer"])):
        cells = []
        for r in by.values():
            cells += [f"{r['density_per_layer'][layer]:.3f}", f"{r['rel_err_per_layer'][layer]:.4f}"]
        out.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plot(records, path):
    """Top-1 agreement, density and needle accuracy against alpha: color = length, solid = correction
    on, dashed = off, square markers = block size 64."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    colors = {2048: "tab:blue", 4096: "tab:green", 8192: "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    alphas_seen = set()
    for length, bs, _, prompts in sweep_groups(records):
        rs = [r for r in records if r["config"] != "dense" and r["prompt"] in prompts]
        dense_needles = [r["correct"] for r in records if r["config"] == "dense" and r["length"] == length
                         and r["prompt"] in prompts and r["answer_key"]]
        if dense_needles:
            axes[2].axhline(100 * np.mean(dense_needles), color=colors.get(length, "k"), lw=1, ls=":",
                            label=f"{length // 1024}K dense ({len(dense_needles)} needles)")
        for corr in (True, False):
            sel = [r for r in rs if r["length"] == length and r["block_size"] == bs
                   and r["mean_correction"] == corr]
            floor = [r for r in sel if r["alpha"] == 0]
            if floor and corr is False and bs == max(c[0] for c in sparse_configs(rs)):
                axes[0].axhline(100 * pooled(floor)[0], color=colors.get(length, "k"), lw=1, ls=":",
                                label=f"{length // 1024}K bs{bs} alpha 0 (dense, library dtype)")
            alphas = sorted({r["alpha"] for r in sel if r["alpha"] > 0})
            if not alphas:
                continue
            alphas_seen.update(alphas)
            top1, dens, needle = [], [], []
            for a in alphas:
                cfg = [r for r in sel if r["alpha"] == a]
                top1.append(100 * pooled(cfg)[0])
                dens.append(100 * np.mean([r["density"] for r in cfg]))
                nd = [r["correct"] for r in cfg if r["answer_key"]]
                needle.append(100 * np.mean(nd) if nd else np.nan)
            style = dict(color=colors.get(length, "k"), ls="-" if corr else "--",
                         marker="s" if bs == 64 else "o", ms=5,
                         label=f"{length // 1024}K bs{bs} corr {'on' if corr else 'off'}")
            axes[0].plot(alphas, top1, **style)
            axes[1].plot(alphas, dens, **style)
            if not all(np.isnan(needle)):
                axes[2].plot(alphas, needle, **style)
    axes[0].axhline(99, color="k", lw=1, ls=":", label="99 % goal")
    titles = ("next-token top-1 agreement with dense (%)", "density (% of causal 64-token tiles)",
              "needle accuracy (%)")
    ticks = sorted(alphas_seen)
    for ax, title in zip(axes, titles):
        ax.set_xscale("log")
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{a:g}" for a in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("alpha")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle("SmolLM2-135M-Instruct: flashprefill prefill in all 30 layers vs dense (decode dense)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results", nargs="+")
    p.add_argument("--out", default="docs")
    args = p.parse_args()
    records, variants = split_variants(load(args.results))
    parts = ["## Dense model check\n", perplexity_table(records),
             "## Paper default (alpha 0.1), correction on / off, every prompt\n", default_table(records),
             "## Sweeps (each table over the prompts that all its configurations ran)\n", sweep_tables(records),
             provenance(records), "## Needles\n", needle_detail(records)]
    for length in (2048, 4096, 8192):
        table = per_layer_table(records, length)
        if table:
            parts += [f"## Per layer, {length} tokens (lm/kjv)\n", table]
    if variants:
        parts += ["## Selection rules (selection_variants.py, torch float32)\n", variant_table(variants),
                  provenance(variants)]
        plot_variants(variants, os.path.join(args.out, "selection_rules.png"))
    tables = os.path.join(os.path.dirname(os.path.abspath(args.results[0])), "tables.md")
    with open(tables, "w") as f:
        f.write("\n".join(parts))
    plot(records, os.path.join(args.out, "accuracy_vs_alpha.png"))
    print(f"wrote {tables} and {os.path.join(args.out, 'accuracy_vs_alpha.png')}")


if __name__ == "__main__":
    main()
