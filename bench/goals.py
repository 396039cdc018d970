"""The attention operator's goals checked against one run of bench_attention.py (or of
bench_fp8.py: the FP8 goals).

Reads the --json file the benchmark wrote (or a results file of bench/results/) and prints one
line per goal row: the measured value, the goal and whether this run met it. Rows the run did
not produce (a skipped group, a failed baseline) are reported as not measured, never as met.

Usage: python3 bench/goals.py attention_bench.json | bench/results/<run>.json
"""

import json
import math
import sys

DENSE_MIN_VS_CUDNN = 1.0   # dense mode at least cuDNN's throughput
SPARSE_MAX_RATIO = 1.15    # time <= 1.15 x rho x dense-mode time
FLEX_MIN_SPEEDUP = 1.0     # faster than FlexAttention on the same block mask
FP8_MIN_VS_BF16 = 1.6      # e4m3 dense at least 1.6 x our bf16 dense throughput
FP8_PREFILL_MIN_VS_FA2 = 50.0  # the whole e4m3 prefill at ~5 % density, 50 x FA2 dense


def _number(row, key):
    value = row.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def goal_rows(rows):
    """[(name, value or None, goal text, met: True / False / None)] for every goal of the operator."""
    out = []

    def add(name, value, goal, ok):
        out.append((name, value, goal, None if value is None else ok(value)))

    for row in rows:
        kind = row.get("row")
        if kind == "dense":
            add(f"dense {row['L']}: ours / cuDNN throughput", _number(row, "ours_vs_cudnn"),
                f">= {DENSE_MIN_VS_CUDNN:g}", lambda v: v >= DENSE_MIN_VS_CUDNN)
        elif kind == "sparse":
            corr = "with" if row.get("correction") else "without"
            add(f"sparse {row['L']} rho {row['rho']:g} {corr} correction: time / (density x dense)",
                _number(row, "ratio_to_rho_dense"), f"<= {SPARSE_MAX_RATIO:g}",
                lambda v: v <= SPARSE_MAX_RATIO)
            if not row.get("correction"):
                add(f"sparse {row['L']} rho {row['rho']:g}: FlexAttention time / ours",
                    _number(row, "speedup_vs_flex"), f"> {FLEX_MIN_SPEEDUP:g}",
                    lambda v: v > FLEX_MIN_SPEEDUP)
        elif kind == "fp8_dense":
            add(f"fp8 dense {row['L']}: e4m3 / our bf16 throughput", _number(row, "fp8_vs_bf16"),
                f">= {FP8_MIN_VS_BF16:g}", lambda v: v >= FP8_MIN_VS_BF16)
        elif kind == "fp8_sparse":
            add(f"fp8 sparse {row['L']} rho {row['rho']:g}: time / (density x e4m3 dense)",
                _number(row, "ratio_to_rho_dense"), f"<= {SPARSE_MAX_RATIO:g}",
                lambda v: v <= SPARSE_MAX_RATIO)
        elif kind == "fp8_prefill":
            add(f"fp8 prefill {row['L']} ({row.get('q_dtype', 'e4m3')} q): FA2 time / ours",
                _number(row, "speedup_vs_fa2"), f">= {FP8_PREFILL_MIN_VS_FA2:g}",
                lambda v: v >= FP8_PREFILL_MIN_VS_FA2)
    return out


def format_table(goals):
    lines = [f"{'goal row':72s} {'value':>8s} {'goal':>8s}  result"]
    for name, value, goal, met in goals:
        shown = "-" if value is None else f"{value:.3f}"
        result = "not measured" if met is None else ("met" if met else "MISSED")
        lines.append(f"{name:72s} {shown:>8s} {goal:>8s}  {result}")
    measured = [m for _, _, _, m in goals if m is not None]
    lines.append(f"{sum(measured)} of {len(goals)} goal rows met"
                 f" ({len(goals) - len(measured)} not measured)")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        rows = json.load(f)
    if isinstance(rows, dict):  # a results file (bench/results/): its rows
        rows = rows.get("rows", [])
    print(format_table(goal_rows(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
