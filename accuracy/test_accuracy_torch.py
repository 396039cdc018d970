"""The torch selection rules (selection_variants.py) and the density breakdown (breakdown.py)
against the numpy model of the contract and the library's index, on structured random data; on
a machine with CUDA the rules also run there. Skips without torch.

    python3 -m pytest -q accuracy/test_accuracy_torch.py
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sparse_reference                                              # noqa: E402
from test_accuracy_units import SMALL, library, structured_problem   # noqa: E402

torch = pytest.importorskip("torch")


def torch_devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("correction", [True, False])
def test_paper_rule_in_torch_is_the_reference(block_size, correction):
    import selection_variants
    q, k, v = structured_problem(1024)
    ref, rs = sparse_reference.prefill(q, k, v, block_size=block_size, alpha=0.1,
                                       mean_correction=correction, return_stats=True, **SMALL)
    assert 0.3 < rs["density"] < 1.0
    for device in torch_devices():
        tq, tk, tv = (torch.as_tensor(a, device=device) for a in (q, k, v))
        out, ts = selection_variants.prefill(tq, tk, tv, block_size=block_size, alpha=0.1,
                                             mean_correction=correction, return_stats=True,
                                             **SMALL)
        assert ts["selected_tiles"] == rs["selected_tiles"]
        np.testing.assert_allclose(out.cpu().numpy(), ref, atol=1e-4)


def test_threshold_variants_order_and_limits():
    """freemax keeps a superset of the paper's blocks (its max is over fewer blocks); alpha 0
    keeps every block under every rule; topp keeps fewer blocks as alpha grows."""
    import selection_variants as sv
    q, k, v = (torch.as_tensor(a) for a in structured_problem(1024))
    dens = {}
    for rule in ("paper", "freemax", "topp", "rownorm", "oracle"):
        for alpha in (0.0, 0.05, 0.3):
            _, st = sv.prefill(q, k, v, alpha=alpha, rule=rule, return_stats=True, **SMALL)
            dens[rule, alpha] = st["density"]
        assert dens[rule, 0.0] == 1.0
    assert dens["freemax", 0.05] >= dens["paper", 0.05]
    assert dens["freemax", 0.3] >= dens["paper", 0.3]
    assert dens["topp", 0.3] < dens["topp", 0.05] < 1.0
    with pytest.raises(ValueError):
        sv.prefill(q, k, v, rule="nope")


def test_breakdown_counts_are_the_selection():
    """The per-rule tile counts add up to the selected tiles of the torch rule and of the
    library's index; E_max holders cover every non-recent query tile."""
    import breakdown
    import selection_variants as sv
    q, k, v = (torch.as_tensor(a) for a in structured_problem(1024))
    for alpha in (0.05, 0.5):
        counts, holders = breakdown.layer_breakdown(q, k, alpha, **SMALL)
        _, st = sv.prefill(q, k, v, alpha=alpha, return_stats=True, **SMALL)
        assert sum(counts[r] for r in breakdown.RULE_ORDER) == st["selected_tiles"]
        assert counts["causal"] * st["density"] == pytest.approx(st["selected_tiles"])
        assert counts["recent"] > 0 and counts["sink"] > 0 and counts["diagonal"] > 0
        n_tiles = -(-(3 * 1024) // 128)                             # g = 3 rows a token
        assert sum(holders.values()) == 3 * (n_tiles - 1)            # 3 KV heads, 1 recent tile
    fp = library()
    for alpha in (0.05, 0.5):
        counts, _ = breakdown.layer_breakdown(q, k, alpha, **SMALL)
        lib = breakdown.library_selected_tiles(fp, q, k, v, alpha, **SMALL)
        assert lib == sum(counts[r] for r in breakdown.RULE_ORDER)
