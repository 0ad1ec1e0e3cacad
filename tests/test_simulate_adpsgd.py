"""AD-PSGD as its authors run it, in the simulator: the measured defaults (and the committed files they come
from), the per-step averaging, exchanges that do not keep up costing convergence, the fixed point, and a
measured c outside its physical range said as unmeasured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_util import load_script
from wagma_bench.simulate.measured import read_measured

ROOT = Path(__file__).resolve().parents[1]
MEASURE_INPUTS = ROOT / "reproduce" / "scaling" / "measure_inputs.py"


def test_a_cost_outside_its_range_is_written_as_unmeasured_with_its_raw_values(tmp_path, monkeypatch):
    """`make gpu-check` on a loaded machine got c = -572.5 and -217.6 from its two pairs and wrote gossip_cost
    0.0 with the interval [0.0, 0.0]: a measurement of nothing said as a measured zero. Held to [0, 1] only
    where the raw value lies in it; otherwise unmeasured, with the raw values, and `--measured` reads no c."""
    script = load_script(MEASURE_INPUTS)
    rows = [
        {"world_size": 4, "pair": i, "compute_on_s": 1.0, "compute_off_s": 1.0 - c * 0.001, "busy_s": 0.001,
         "busy_share": 0.001, "slowdown": 0.0, "actives": 0.0, "passives": 0.0, "c": c}
        for i, c in enumerate([-572.5, -217.6])
    ]  # fmt: skip
    network = {"levels": {"intra": {"alpha_s": 1e-5, "bandwidth_GBps": 1.0}}}
    spread = {"sigma_rank": 0.01, "sigma": 0.02, "rho": 0.1}
    monkeypatch.setattr(script, "measure", lambda *_: (rows, network, spread))
    out = tmp_path / "measured.json"
    assert script.main(["g", "b.json", "--out", str(out)]) == 0
    cost = json.loads(out.read_text())["gossip_cost"]
    assert cost["value"] is None and cost["interval"] is None and cost["replicates"] == []
    assert cost["raw"] == pytest.approx([-572.5, -217.6]) and "outside" in cost["unmeasured"]
    measured = read_measured(out)
    assert measured.gossip_cost is None and "gossip_cost unmeasured" in measured.line()
