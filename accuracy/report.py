"""Tables (markdown) and the frontier plot from the JSON lines of run.py and breakdown.py.

    python3 accuracy/report.py RESULTS.jsonl ... --tables OUT.md [--plot OUT.png]

Needles: exact-match accuracy of dense and of each configuration on the same prompts, and the
paired difference (configuration - dense) with Newcombe's 95 % interval for paired proportions
(his method 10: Wilson score limits combined with the phi correlation of the pairs).
Next-token agreement: top-1 agreement and KL(dense || sparse) pooled over the held-out positions.
Precisions: the library's configurations in each precision of its attention (the model's,
bfloat16, FP8 e4m3 Q/K/V) side by side, against the same exact dense run.
Rules at equal density: each rule's top-1 agreement interpolated at the densities the paper's
rule reached. Breakdown (breakdown.py): share of the selected tiles per rule, and where E_max is.
"""

from __future__ import annotations

import argparse
import collections
import json
import math

import numpy as np

from breakdown import EMAX_HOLDERS, RULE_ORDER
from tasks import KINDS

Z95 = 1.959963984540054


def load(paths):
    out = []
    for path in paths:
        with open(path) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def wilson(k, n, z=Z95):
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)


def paired_difference(x, y):
    """x, y: paired booleans (configuration, dense). -> (p_x - p_y, low, high), Newcombe's
    method 10."""
    x, y = np.asarray(x, bool), np.asarray(y, bool)
    n = len(x)
    a, b = int((x & y).sum()), int((x & ~y).sum())
    c, d = int((~x & y).sum()), int((~x & ~y).sum())
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n)
    l2, u2 = wilson(a + c, n)
    den = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(den) if den else 0.0
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    eps = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return p1 - p2, p1 - p2 - delta, p1 - p2 + eps


def config_key(r):
    return (r["backend"], r["config"])


def needle_table(records):
    rows = ["| length | kind | config | prompts | dense | config acc. | difference [95 % CI] | "
            "gained / lost |", "| ---: | --- | --- | ---: | ---: | ---: | --- | --- |"]
    dense = {(r["length"], r["prompt"]): r["correct"] for r in records
             if r["config"] == "dense" and r["kind"] != "text"}
    groups = collections.defaultdict(dict)
    for r in records:
        if r["config"] != "dense" and r["kind"] != "text" and (r["length"], r["prompt"]) in dense:
            groups[(r["length"], config_key(r))][r["prompt"]] = (r["correct"], r["kind"])
    for (length, key), got in sorted(groups.items()):
        for kind in ("all", "single", "multikey", "multivalue"):
            names = [p for p, (_, k) in got.items() if kind == "all" or k == kind]
            if not names:
                continue
            x = [got[p][0] for p in names]
            y = [dense[(length, p)] for p in names]
            diff, lo, hi = paired_difference(x, y)
            gained = sum(a and not b for a, b in zip(x, y))
            lost = sum(b and not a for a, b in zip(x, y))
            rows.append(f"| {length} | {kind} | {_label(key)} | {len(names)} | "
                        f"{100 * np.mean(y):.1f} % | {100 * np.mean(x):.1f} % | "
                        f"{100 * diff:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
                        f"{gained} / {lost} |")
    return "\n".join(rows) + "\n"


def _label(key):
    backend, config = key
    return config if backend == "fp" else f"{backend[3:]} {config}"


def pooled(rs):
    n = sum(r["n"] for r in rs)
    return (sum(r["top1_hits"] for r in rs) / n, sum(r["kl_mean"] * r["n"] for r in rs) / n, n)


def agreement_table(records, kinds=("text",)):
    """Top-1 / KL / density per length and configuration over the prompts of `kinds`."""
    rows = ["| length | config | prompts | density (tiles) | density (pairs) | top-1 agreement | "
            "KL(dense‖sparse) | positions | seconds a prompt |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    groups = collections.defaultdict(list)
    for r in records:
        if r["config"] != "dense" and r["kind"] in kinds:
            groups[(r["length"], config_key(r))].append(r)
    for (length, key), rs in sorted(groups.items()):
        top1, kl, n = pooled(rs)
        pairs = [r["pair_density"] for r in rs if "pair_density" in r]
        rows.append(f"| {length} | {_label(key)} | {len(rs)} | "
                    f"{np.mean([r['density'] for r in rs]):.3f} | "
                    f"{np.mean(pairs) if pairs else float('nan'):.3f} | {100 * top1:.2f} % | "
                    f"{kl:.2e} | {n} | {np.mean([r['wall_s'] for r in rs]):.1f} |")
    return "\n".join(rows) + "\n"


def attn_dtype(r):
    """The precision of a record's attention: its attn_dtype, else the model's ("cpu (float32)")."""
    return r.get("attn_dtype") or r["device"].rsplit("(", 1)[-1].rstrip(")")


def precision_table(records):
    """The library's configurations side by side per precision (model's, bfloat16, FP8): density,
    top-1 and KL on the text windows and on the needles' haystack positions, and the needles
    answered (dense's on the same prompts), per length, alpha and correction."""
    rows = ["| length | alpha | correction | attention | prompts | density | top-1, text | "
            "KL, text | top-1, haystacks | KL, haystacks | needles (dense) |",
            "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    dense = {(r["length"], r["prompt"]): r["correct"] for r in records
             if r["config"] == "dense" and r["kind"] != "text"}
    groups = collections.defaultdict(list)
    for r in records:
        if r["backend"] == "fp":
            groups[(r["length"], r["alpha"], r["block_size"], not r["mean_correction"],
                    attn_dtype(r))].append(r)
    for (length, alpha, block_size, nocorr, dtype), rs in sorted(groups.items()):
        cells = []
        for kinds in (("text",), KINDS):
            part = [r for r in rs if r["kind"] in kinds]
            if part:
                top1, kl, _ = pooled(part)
                cells += [f"{100 * top1:.2f} %", f"{kl:.2e}"]
            else:
                cells += ["–", "–"]
        needles = [r for r in rs if r["kind"] != "text" and (length, r["prompt"]) in dense]
        answered = (f"{sum(r['correct'] for r in needles)} / {len(needles)} "
                    f"({sum(dense[(length, r['prompt'])] for r in needles)})" if needles else "")
        corr = ("off" if nocorr else "on") + ("" if block_size == 128 else f", block {block_size}")
        rows.append(f"| {length} | {alpha:g} | {corr} | {dtype} | {len(rs)} | "
                    f"{np.mean([r['density'] for r in rs]):.3f} | " + " | ".join(cells)
                    + f" | {answered} |")
    return "\n".join(rows) + "\n"


def frontier(records):
    """{length: {rule: [(density, top-1, alpha)] sorted by density}} on the text windows; the
    library ("library") by tile density, the variants by pair density."""
    out = collections.defaultdict(dict)
    groups = collections.defaultdict(list)
    for r in records:
        if r["config"] != "dense" and r["kind"] == "text" and r.get("mean_correction", True):
            rule = "library" if r["backend"] == "fp" else r["backend"][3:]
            if rule == "library" and r["block_size"] != 128:
                continue
            groups[(r["length"], rule, r["alpha"])].append(r)
    for (length, rule, alpha), rs in groups.items():
        dens = np.mean([r.get("pair_density", r["density"]) for r in rs])
        out[length].setdefault(rule, []).append((float(dens), pooled(rs)[0], alpha))
    for rules in out.values():
        for pts in rules.values():
            pts.sort()
    return out


def equal_density_table(records):
    """Each rule's top-1 at the paper rule's densities (linear interpolation inside the rule's
    measured range), minus the paper rule's."""
    rows = ["| length | rule | paper's densities compared | gain in top-1 at equal density "
            "(points): min / mean / max |", "| ---: | --- | ---: | --- |"]
    for length, rules in sorted(frontier(records).items()):
        if "paper" not in rules:
            continue
        base = rules["paper"]
        for rule, pts in sorted(rules.items()):
            if rule in ("paper", "library"):
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            gains = [100 * (np.interp(d, xs, ys) - t) for d, t, _ in base if xs[0] <= d <= xs[-1]]
            if gains:
                rows.append(f"| {length} | {rule} | {len(gains)} | {min(gains):+.2f} / "
                            f"{np.mean(gains):+.2f} / {max(gains):+.2f} |")
            else:
                rows.append(f"| {length} | {rule} | 0 | (densities do not overlap) |")
    return "\n".join(rows) + "\n"


def plot_frontier(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = frontier(records)
    lengths = sorted(data)
    fig, axes = plt.subplots(1, len(lengths), figsize=(max(5.2 * len(lengths), 7.5), 4.3), squeeze=False)
    markers = {"library": "*", "paper": "o", "freemax": "v", "topp": "D", "rownorm": "s",
               "perhead": "^", "oracle": "P"}
    for ax, length in zip(axes[0], lengths):
        for rule, pts in sorted(data[length].items()):
            ax.plot([100 * p[0] for p in pts], [100 * p[1] for p in pts],
                    marker=markers.get(rule, "x"), ms=8 if rule == "library" else 5,
                    ls="none" if rule == "library" else "-", label=rule)
        ax.set_xlabel("density (% of causal pairs; library: % of tiles)")
        ax.set_ylabel("top-1 agreement with dense (%)")
        ax.set_title(f"{length} tokens (text windows)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct through transformers: selection rules, accuracy vs density")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def breakdown_table(records):
    rows = ["| length | prompt | alpha | density | library density | "
            + " | ".join(f"{r} share" for r in RULE_ORDER) + " | "
            + " | ".join(f"E_max in {h}" for h in EMAX_HOLDERS) + " |",
            "| ---: | --- | ---: | ---: | ---: |" + " ---: |" * (len(RULE_ORDER) + len(EMAX_HOLDERS))]
    for rec in sorted(records, key=lambda r: (r["length"], r["prompt"], r["alpha"])):
        layers = rec["layers"]
        total = {r: sum(x[r] for x in layers) for r in RULE_ORDER}
        sel, causal = sum(total.values()), sum(x["causal"] for x in layers)
        lib = sum(x["library_selected"] for x in layers)
        emax = {h: sum(x[f"emax_{h}"] for x in layers) for h in EMAX_HOLDERS}
        n = sum(emax.values())
        rows.append(f"| {rec['length']} | {rec['prompt']} | {rec['alpha']:g} | {sel / causal:.3f} | "
                    f"{lib / causal:.3f} | "
                    + " | ".join(f"{total[r] / sel:.3f}" for r in RULE_ORDER) + " | "
                    + " | ".join(f"{emax[h] / n:.3f}" for h in EMAX_HOLDERS) + " |")
    return "\n".join(rows) + "\n"


def provenance(records):
    dates = sorted(r["date"] for r in records)
    commands = sorted({r["command"] for r in records})
    devices = sorted({r["device"] for r in records})
    return (f"Measured {dates[0]} – {dates[-1]} on {', '.join(devices)}; made by:\n"
            + "\n".join(f"`{c}`" for c in commands) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+")
    p.add_argument("--tables", required=True, help="markdown file to write")
    p.add_argument("--plot", help="frontier plot (PNG) to write")
    args = p.parse_args()
    records = load(args.results)
    runs = [r for r in records if "layers" not in r]
    splits = [r for r in records if "layers" in r]
    parts = []
    if runs:
        parts += ["## Needles (exact match, paired with dense)\n", needle_table(runs),
                  "## Next-token agreement, text windows\n", agreement_table(runs),
                  "## Next-token agreement, haystack positions of the needle prompts\n",
                  agreement_table(runs, KINDS),
                  "## Rules at equal density (text windows)\n", equal_density_table(runs)]
        if len({attn_dtype(r) for r in runs if r["backend"] == "fp"}) > 1:
            parts += ["## Precisions side by side (the library's configurations)\n",
                      precision_table(runs)]
        parts.append(provenance(runs))
        if args.plot:
            plot_frontier(runs, args.plot)
    if splits:
        parts += ["## Where the density goes (breakdown.py)\n", breakdown_table(splits),
                  provenance(splits)]
    with open(args.tables, "w") as f:
        f.write("\n".join(parts))
    print(f"wrote {args.tables}" + (f" and {args.plot}" if args.plot and runs else ""))


if __name__ == "__main__":
    main()
