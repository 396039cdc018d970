"""bench/report.py: docs/PERF.md and README.md's results block from results files (no GPU).

The results files here are fixtures: `fixtures/` holds the output of a CPU smoke run of the
benchmarks (`--device cpu`, the library's CPU reference, tiny lengths: code paths, not
measurements), and the tests below write small hand-made records into temporary folders. None of
them is a measurement, and none is in bench/results/.
"""

import json
import pathlib
import shutil
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import report  # noqa: E402

FIXTURES = BENCH / "fixtures"
README_TEMPLATE = (f"# project\n\nbefore\n\n{report.README_BEGIN}\nold text\n{report.README_END}\n"
                   "\nafter\n")


def record(bench, rows, date="2026-01-01T00:00:00+00:00", **extra):
    return {"bench": bench, "command": f"python3 bench/bench_{bench}.py --results x",
            "date": date, "machine": "FIXTURE GPU", "commit": "0123456789abcdef",
            "tree": "clean", "complete": True, "rows": rows, **extra}


def render(tmp_path, results_dir, plots=False):
    perf, readme = tmp_path / "PERF.md", tmp_path / "README.md"
    readme.write_text(README_TEMPLATE)
    args = ["--results", str(results_dir), "--perf", str(perf), "--readme", str(readme)]
    if not plots:
        args += ["--check"]  # plots are only made when writing; --check compares text
        assert report.main(args) == 1  # nothing written yet: out of date
        args.remove("--check")
    assert report.main(args + ["--plots", str(tmp_path / "plots")]) == 0
    return perf.read_text(), readme.read_text()


def test_without_results_every_section_says_not_measured(tmp_path):
    perf, readme = render(tmp_path, tmp_path / "none")
    assert perf.count("*Not measured yet:") == 10
    assert "## What did not work" in perf
    assert "before" in readme and "after" in readme and "old text" not in readme
    assert "Performance: not measured yet" in readme


def test_rows_become_tables_and_the_newest_run_is_reported(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    old = record("attention", [{"row": "dense", "L": 8192, "ours_ms": 9.0}],
                 date="2025-01-01T00:00:00+00:00")
    rows = [
        {"row": "dense", "L": 8192, "ours_ms": 1.0, "ours_tflops": 555.5, "cudnn_ms": 1.1,
         "cudnn_tflops": 505.0, "fa2_ms": 1.9, "fa2_tflops": 292.4, "ours_vs_cudnn": 1.1,
         "err_vs_cudnn": 0.002, "clock_mhz": 1700},
        {"row": "sparse", "L": 8192, "rho": 0.05, "density": 0.051, "correction": 0,
         "ours_ms": 0.07, "dense_ms": 1.0, "ratio_to_rho_dense": 1.3725, "speedup_vs_flex": 1.4},
        {"row": "sparse", "L": 8192, "rho": 0.05, "density": 0.051, "correction": 1,
         "ours_ms": 0.08, "dense_ms": 1.0, "ratio_to_rho_dense": 1.5686},
        {"row": "sparse", "L": 8192, "rho": 0.222, "density": 0.223, "correction": 1,
         "ours_ms": 0.25, "ratio_to_rho_dense": 1.12, "source": "a model"},
        {"row": "prefill", "workload": "demo", "L": 8192, "q_scale": 1.0, "density": 0.22,
         "index_ms": 0.05, "attn_ms": 0.3, "total_ms": 0.35, "fa2_ms": 1.75, "cudnn_ms": 1.0,
         "speedup_vs_fa2": 5.0, "speedup_vs_cudnn": 2.857, "err_vs_dense": 0.05},
        {"row": "prefill", "workload": "demo_q_scaled", "L": 8192, "q_scale": 0.25,
         "target_density": 0.05, "calibrated_at": 131072, "density": 0.31, "index_ms": 0.05, "attn_ms": 0.4, "total_ms": 0.45, "fa2_ms": 1.75,
         "cudnn_ms": 1.0, "speedup_vs_fa2": 3.889, "err_vs_dense": None},
    ]
    (results / "a.json").write_text(json.dumps(old))
    (results / "b.json").write_text(json.dumps(record("attention", rows)))
    (results / "c.json").write_text(json.dumps(record("index", [
        {"row": "index", "L": 8192, "index_graph_ms": 0.052, "index_eager_ms": 0.06,
         "cudnn_ms": 1.0, "ratio_vs_cudnn": 0.052, "density": 0.2}], complete=False)))
    perf, readme = render(tmp_path, results)
    assert "*From `bench/results/b.json`: FIXTURE GPU, 2026-01-01T00:00:00+00:00, commit " \
           "`0123456789`.*" in perf
    assert "9.00 ms" not in perf  # the older run is listed, not reported
    assert "| `a.json` | attention | 2025-01-01" in perf
    assert "`bench/results/c.json` (stopped before its last row)" in perf
    assert "| 8K | 1.000 ms | 556 | 505 | 292 | 1.10x | 0.0020 | 1700 MHz |" in perf
    assert "| 8K | 5.0 % | 0.0510 | 0.07000 ms | 1.37 | 0.08000 ms | 1.57 | 1.40x | random mask |" \
        in perf
    assert "| demo_q_scaled | 8K | 31.0 % | 0.250 |" in perf
    assert "5.20 %" in perf  # the index stage's share of cuDNN's time
    assert "3 of 5 goal rows met (0 not measured)" in perf
    # README: the demo, the ~5 % workload, the 5 % mask and the model's density, with the run
    on = "FIXTURE GPU, 2026-01-01, `0123456789` |"
    assert f"| whole prefill, the demo's synthetic workload | 8K | 22.0 % | 5.00x | 2.86x | {on}" \
        in readme
    assert ("| whole prefill, the demo's workload with queries scaled to 5.0 % density at 128K | "
            f"8K | 31.0 % | 3.89x | - | {on}") in readme
    assert f"| sparse attention, a random block mask | 8K | 5.10 % | 23.8x | 13.8x | {on}" in readme
    assert ("| sparse attention, a model: its measured density | 8K | 22.3 % | 7.60x | 4.40x | "
            f"{on}") in readme
    assert "From `bench/results/b.json`;" in " ".join(readme.split())


def test_each_section_reports_the_newest_run_that_measured_it(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    full = [{"row": "dense", "L": 8192, "ours_ms": 1.0, "ours_vs_cudnn": 1.05},
            {"row": "paged", "L": 8192, "page_size": 16, "pages": "shuffled", "ours_ms": 1.2,
             "paged_vs_contiguous": 1.2}]
    (results / "a.json").write_text(json.dumps(record("attention", full,
                                                      date="2026-01-01T00:00:00+00:00")))
    (results / "b.json").write_text(json.dumps(record(
        "attention", [{"row": "paged", "L": 8192, "page_size": 16, "pages": "shuffled",
                       "ours_ms": 1.3, "paged_vs_contiguous": 1.3}],
        date="2026-01-02T00:00:00+00:00", complete=False)))
    perf, _ = render(tmp_path, results)
    dense = perf[perf.index("## Dense mode"):perf.index("## The index stage")]
    paged = perf[perf.index("## Paged KV"):perf.index("## Goals")]
    assert "`bench/results/a.json`" in dense and "| 8K | 1.000 ms |" in dense
    assert "`bench/results/b.json` (stopped before its last row)" in paged
    assert "| 16 | shuffled | 1.300 ms | 1.30x |" in paged and "1.20x" not in paged


def test_check_passes_once_rendered_and_fails_when_edited(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    perf_text, _ = render(tmp_path, results)
    args = ["--results", str(results), "--perf", str(tmp_path / "PERF.md"),
            "--readme", str(tmp_path / "README.md"), "--plots", str(tmp_path / "plots"),
            "--check"]
    assert report.main(args) == 0
    (tmp_path / "PERF.md").write_text(perf_text.replace("|", "/", 1))
    assert report.main(args) == 1


def test_the_cpu_smoke_run_renders_every_section(tmp_path):
    """The fixture is what bench_attention.py, bench_index.py, bench_host.py, bench_vllm.py,
    bench_long.py and bench_fp8.py wrote on the CPU."""
    runs = report.load_results(FIXTURES)
    assert {r["bench"] for _, r in runs} == {"attention", "index", "host", "vllm", "long",
                                                   "fp8"}
    assert all(r["machine"].startswith("CPU") for _, r in runs)
    perf, readme = render(tmp_path, FIXTURES)
    for kind in ("dense", "sparse", "prefill", "paged", "paged_sparse", "paged_chunk", "chunk",
                 "vllm_chunk_index", "vllm_prefill", "fp8_dense", "fp8_sparse", "fp8_prefill"):
        assert any(row.get("row") == kind for _, r in runs for row in r["rows"]), kind
    assert "Not measured" not in perf
    assert "| demo_q_scaled |" in perf and "| whole prefill" in readme
    vllm = perf[perf.index("## The vLLM backend"):perf.index("## Results files")]
    assert "| 0 | 512 | 0 |" in vllm and "| all | 2K |" in vllm
    assert "| whole prompt | dense | 1K / 1K |" in vllm and "| 100 % |" in vllm
    long = perf[perf.index("## Long prefills"):]
    assert "| 1K | paged 16 | 3 |" in long and "| NO |" not in long


def test_plots_are_written_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib")
    perf, _ = render(tmp_path, FIXTURES, plots=True)
    for name in ("prefill", "sparse", "dense", "paged"):
        assert (tmp_path / "plots" / f"perf_{name}.png").stat().st_size > 1000
        assert f"(perf_{name}.png)" in perf


def test_a_file_that_is_not_a_results_file_is_refused(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a results file"):
        report.load_results(tmp_path)
