"""A paper-scale prediction's interval and flip condition: the resampling (simulate/uncertainty.py), the
reading (analysis/predictions.py) against direct computations, the measured-inputs file, and `simulate
--interval` end to end on a small world."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wagma_bench.analysis.predictions import flip_points, nearest_flip, speedup_interval
from wagma_bench.analysis.tables import fmt
from wagma_bench.cli.simulate import main as simulate_main
from wagma_bench.imbalance import NoImbalance
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import Workload
from wagma_bench.simulate.measured import FORMAT, read_measured
from wagma_bench.simulate.uncertainty import Inputs, Sources, resample

CLAIM = {
    "subject": "wagma",
    "comparators": ["allreduce", "adpsgd"],
    "metric": "throughput",
    "lower_is_better": False,
}


def prediction(wagma: float, allreduce: float, adpsgd: float) -> dict:
    return {
        "64": {
            "wagma": {"throughput": wagma},
            "allreduce": {"throughput": allreduce},
            "adpsgd": {"throughput": adpsgd},
        }
    }


def test_the_interval_is_the_percentiles_of_each_replicates_speedup_against_its_own_best():
    rng = np.random.default_rng(0)
    triples = rng.uniform(50, 150, (200, 3))
    data = {"predictions": [prediction(*t) for t in triples]}
    direct = [w / max(a, d) for w, a, d in triples]
    assert speedup_interval(data, 64, **CLAIM) == pytest.approx(tuple(np.percentile(direct, [2.5, 97.5])))
    times = {**CLAIM, "metric": "time_to_target_s", "lower_is_better": True}
    data = {
        "predictions": [
            {"64": {o: {"time_to_target_s": v} for o, v in zip(("wagma", "allreduce", "adpsgd"), t)}}
            for t in triples
        ]
    }
    direct = [min(a, d) / w for w, a, d in triples]
    assert speedup_interval(data, 64, **times) == pytest.approx(tuple(np.percentile(direct, [2.5, 97.5])))


def test_the_flip_is_where_the_speedup_crosses_its_threshold_between_grid_points():
    """AD-PSGD's throughput falls as its exchange costs more: WAGMA-SGD (100) ties it at c with 120 / (1 + c)
    = 100, between the grid points 0.1 (109.1) and 0.4 (85.7): linear there, 0.1 + 0.3 * 9.09 / 23.38."""
    points = [
        {
            "knob": "gossip_cost",
            "says": "c =",
            "value": c,
            "factor": False,
            "base": 0.05,
            "predicted": prediction(100, 80, 120 / (1 + c)),
        }
        for c in (0.0, 0.1, 0.4, 0.8)
    ]
    points += [
        {
            "knob": "spread",
            "says": "spread x",
            "value": f,
            "factor": True,
            "base": 1.0,
            "predicted": prediction(100 / (1 + 0.05 * f), 80, 70),
        }
        for f in (0.0, 1.0, 3.0)
    ]  # never ties
    flips = {f["knob"]: f for f in flip_points({"sensitivity": points}, 64, 1.0, **CLAIM)}
    r0, r1 = 100 / (120 / 1.1), 100 / (120 / 1.4)
    assert flips["gossip_cost"]["crossing"] == pytest.approx(0.1 + 0.3 * (1 - r0) / (r1 - r0))
    assert flips["gossip_cost"]["distance"] == pytest.approx(flips["gossip_cost"]["crossing"] - 0.05)
    assert flips["spread"]["crossing"] is None
    assert nearest_flip(list(flips.values()))["knob"] == "gossip_cost"


def test_a_replicate_resamples_the_runs_behind_its_inputs_and_is_a_function_of_its_number():
    base = Inputs(
        Workload(step_s=2.0, compute="empirical", samples=(2.0,)),
        Network.free(),
        NoImbalance(None, 0),
        {"wagma": 10.0},
        0,
        seed=5,
    )
    sources = Sources(
        spread_runs=[[1.0], [2.0], [3.0]], hits={"wagma": [10.0, 20.0, 30.0]}, gossip_costs=[0.1, 0.2]
    )
    reps = [resample(base, sources, b) for b in range(40)]
    assert [r.seed for r in reps[:3]] == [6, 7, 8]
    assert resample(base, sources, 3) == reps[3]
    for r in reps:  # every input is a bootstrap draw of its runs
        assert set(r.workload.samples) <= {2.0, 4.0, 6.0} and len(r.workload.samples) == 3
        assert r.samples_to_target["wagma"] in (10.0, 20.0, 30.0) and r.workload.gossip_cost in (0.1, 0.2)
    assert (
        len({r.workload.samples for r in reps}) > 5 and len({r.samples_to_target["wagma"] for r in reps}) == 3
    )


def write_measured(path, **sections):
    path.write_text(json.dumps({"format": FORMAT, "measured_on": "cpu", "source": "test", **sections}))
    return path


def test_simulate_interval_writes_replicates_and_the_sensitivity_grid_and_claims_read_it(tmp_path, capsys):
    measured = write_measured(
        tmp_path / "m.json", gossip_cost={"value": 0.3, "interval": [0.2, 0.4], "replicates": [0.2, 0.3, 0.4]}
    )
    out = tmp_path / "sim"
    args = [
        "workload=resnet",
        "data=imagenet",
        "gpus=16",
        "optimizer=wagma,adpsgd,allreduce",
        "imbalance=independent",
        "train.max_rounds=60",
        "control_every=0",
        "--interval",
        "4",
        "--measured",
        str(measured),
        "--out",
        str(out),
    ]
    assert simulate_main(args) == 0
    data = json.loads((out / "interval.json").read_text())
    assert data["replicates"] == 4 and len(data["predictions"]) == 4
    assert any("exchange cost" in s for s in data["resampled"])
    knobs = {p["knob"] for p in data["sensitivity"]}
    assert knobs == {"gossip_cost", "spread", "bandwidth", "imbalance", "control_every"}
    # the measured exchange cost is the point prediction's: AD-PSGD slower than with c = 0 on the grid
    k0 = next(p for p in data["sensitivity"] if p["knob"] == "gossip_cost" and p["value"] == 0.0)
    rows = {r["optimizer"]: r for r in json.loads((out / "predictions.json").read_text())}
    assert rows["adpsgd"]["throughput"] < k0["predicted"]["16"]["adpsgd"]["throughput"]
    assert rows["adpsgd"]["gossip_cost_share"] > 0
    interval = speedup_interval(data, 16, **CLAIM)
    assert interval[0] <= interval[1]
    # the printed table shows each prediction's interval; a line names every input's origin, and time to
    # target's missing input
    said = capsys.readouterr().out
    assert "| samples/s 95% |" in said and "| time to target 95% |" in said
    wagma = [
        v["16"]["wagma"]["throughput"] for v in json.loads((out / "interval.json").read_text())["predictions"]
    ]
    lo, hi = np.percentile(wagma, [2.5, 97.5])
    cells = [fmt(v, "sig") for v in (rows["wagma"]["throughput"], float(lo), float(hi))]
    assert f"| wagma | 16 | {cells[0]} | [{cells[1]}, {cells[2]}] |" in said
    assert (
        "Inputs: cost model: the workload's preset (defaults); network: "
        "cluster profile daint (default); compute spread: the preset's assumed distribution (default); "
        f"measured inputs: {measured}." in said
    )
    assert "Time to target: — for every optimizer: it needs --convergence RUN_DIR|TUNE_DIR" in said


@pytest.mark.parametrize(
    "content,said",
    [
        ("not json", "not valid JSON"),
        (json.dumps({"format": "other"}), "format must be"),
        (json.dumps({"format": FORMAT, "measured_on": "tpu"}), "measured_on='tpu'"),
        (
            json.dumps({"format": FORMAT, "measured_on": "cpu", "gossip_cost": {"value": -1}}),
            "gossip_cost.value=-1 is not allowed",
        ),
        (
            json.dumps({"format": FORMAT, "measured_on": "gpu", "compute": {"skew": 1}}),
            "compute.skew is not a key",
        ),
    ],
)
def test_a_bad_measured_file_is_refused_in_one_line_before_anything_is_simulated(
    content, said, tmp_path, capsys
):
    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="--measured"):
        read_measured(path)
    rc = simulate_main(
        ["gpus=8", "optimizer=allreduce", "--measured", str(path), "--out", str(tmp_path / "sim")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "sim").exists()
