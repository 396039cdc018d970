"""bench/goals.py: which benchmark rows meet the attention operator's goals (no GPU needed)."""

import json
import math
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from goals import format_table, goal_rows  # noqa: E402

ROWS = [
    {"row": "dense", "L": 8192, "ours_vs_cudnn": 1.055},
    {"row": "dense", "L": 32768, "ours_vs_cudnn": 0.99},
    {"row": "sparse", "L": 32768, "rho": 0.1, "correction": 0, "ratio_to_rho_dense": 1.15,
     "speedup_vs_flex": 1.5},
    {"row": "sparse", "L": 32768, "rho": 0.1, "correction": 1, "ratio_to_rho_dense": 1.30},
    {"row": "sparse", "L": 32768, "rho": 0.05, "correction": 0, "ratio_to_rho_dense": float("nan"),
     "flex": "failed: out of memory"},
    {"row": "prefill", "L": 8192, "speedup_vs_fa2": 5.0},
]


def by_name(goals):
    return {name: (value, met) for name, value, _, met in goals}


def test_thresholds_are_inclusive_where_the_goals_say_so():
    g = by_name(goal_rows(ROWS))
    assert g["dense 8192: ours / cuDNN throughput"] == (1.055, True)
    assert g["dense 32768: ours / cuDNN throughput"] == (0.99, False)
    # time <= 1.15 x rho x dense: exactly 1.15 meets it
    assert g["sparse 32768 rho 0.1 without correction: time / (density x dense)"] == (1.15, True)
    assert g["sparse 32768 rho 0.1 with correction: time / (density x dense)"] == (1.30, False)
    assert g["sparse 32768 rho 0.1: FlexAttention time / ours"] == (1.5, True)


def test_missing_or_non_finite_values_are_not_measured_never_met():
    g = by_name(goal_rows(ROWS))
    assert g["sparse 32768 rho 0.05 without correction: time / (density x dense)"] == (None, None)
    assert g["sparse 32768 rho 0.05: FlexAttention time / ours"] == (None, None)
    # rows without a goal (prefill) add nothing
    assert not any(name.startswith("prefill") for name in g)


def test_table_counts_and_marks():
    text = format_table(goal_rows(ROWS))
    assert text.splitlines()[-1] == "3 of 7 goal rows met (2 not measured)"
    assert text.count("MISSED") == 2
    assert text.count("not measured") == 3  # two rows and the summary line


def run_goals(*args):
    script = pathlib.Path(__file__).resolve().parent / "goals.py"
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True)


def test_command_line(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps([r for r in ROWS if not any(
        isinstance(v, float) and math.isnan(v) for v in r.values())]))
    done = run_goals(path)
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == "3 of 5 goal rows met (0 not measured)"
    assert run_goals().returncode == 2


def test_each_sparse_length_is_a_goal_row_of_its_own():
    """The sparse group runs at several lengths (--sparse-lengths): a row met at 128K must not
    hide the same rho missed at 32K."""
    rows = [{"row": "sparse", "L": L, "rho": 0.05, "correction": 0, "ratio_to_rho_dense": v,
             "speedup_vs_flex": 1.4} for L, v in ((32768, 1.27), (131072, 1.11))]
    g = by_name(goal_rows(rows))
    assert g["sparse 32768 rho 0.05 without correction: time / (density x dense)"] == (1.27, False)
    assert g["sparse 131072 rho 0.05 without correction: time / (density x dense)"] == (1.11, True)
    assert format_table(goal_rows(rows)).splitlines()[-1] == "3 of 4 goal rows met (0 not measured)"


FP8_ROWS = [
    {"row": "fp8_dense", "L": 32768, "fp8_vs_bf16": 1.6},
    {"row": "fp8_dense", "L": 131072, "fp8_vs_bf16": 1.34},
    {"row": "fp8_sparse", "L": 131072, "rho": 0.05, "density": 0.0515, "correction": 0,
     "ratio_to_rho_dense": 1.16},
    {"row": "fp8_prefill", "L": 131072, "q_dtype": "e4m3", "speedup_vs_fa2": 50.0},
    {"row": "fp8_prefill", "L": 131072, "q_dtype": "bf16", "speedup_vs_fa2": float("inf")},
]


def test_fp8_goals():
    g = by_name(goal_rows(FP8_ROWS))
    assert g["fp8 dense 32768: e4m3 / our bf16 throughput"] == (1.6, True)
    assert g["fp8 dense 131072: e4m3 / our bf16 throughput"] == (1.34, False)
    assert g["fp8 sparse 131072 rho 0.05: time / (density x e4m3 dense)"] == (1.16, False)
    assert g["fp8 prefill 131072 (e4m3 q): FA2 time / ours"] == (50.0, True)
    assert g["fp8 prefill 131072 (bf16 q): FA2 time / ours"] == (None, None)


def test_a_results_file_is_read_for_its_rows(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"bench": "fp8", "rows": FP8_ROWS[:4]}))
    done = run_goals(path)
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == "2 of 4 goal rows met (0 not measured)"
