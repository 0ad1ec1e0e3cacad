"""Flips found, not interpolated: every crossing of 1 along an assumption by root finding on the monotone
pieces of its grid (wagma_bench/simulate/flips.py), checked against known roots and by running the simulator
at each crossing it states; and the structural range a claim carries (wagma_bench/analysis/predictions.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from wagma_bench.analysis.claims import structure_said
from wagma_bench.analysis.predictions import claim_ratio, flip_points, structural_range, undetermined
from wagma_bench.cli.simulate import parse
from wagma_bench.imbalance import NoImbalance, make_imbalance
from wagma_bench.simulate.configure import compose_runs, load_network, model_inputs, sim_config
from wagma_bench.simulate.convergence import samples_to_target
from wagma_bench.simulate.des import SimConfig, simulate
from wagma_bench.simulate.flips import crossings
from wagma_bench.simulate.presets import preset
from wagma_bench.simulate.uncertainty import KNOBS, Inputs, find_flips

GRID = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]


def test_every_crossing_of_a_non_monotone_curve_is_found():
    # 1 + sin(2 ln x) / 2 crosses 1 where ln x = k pi / 2: four times inside [0.01, 10], once on a grid point
    roots = crossings(lambda x: 1 + 0.5 * math.sin(2 * math.log(x)), GRID)
    assert roots == pytest.approx([math.exp(k * math.pi / 2) for k in (-2, -1, 0, 1)], rel=1e-3)
    # a dip below 1 between two grid points that both lie above it: two crossings, neither end shows it
    dip = crossings(lambda x: 1.1 - 0.3 * math.exp(-(((math.log(x) - math.log(0.17)) / 0.2) ** 2)), GRID)
    half = 0.2 * math.sqrt(math.log(3))
    assert dip == pytest.approx([0.17 * math.exp(-half), 0.17 * math.exp(half)], rel=1e-3)
    # a share from 0 to 1 (AD-PSGD's c) on a linear axis
    assert crossings(lambda c: 1.3 - c, [0.0, 0.25, 0.5, 0.75, 1.0], log=False) == pytest.approx([0.3])
    assert crossings(lambda x: 2.0, GRID) == []


def test_a_bracket_end_whose_log_does_not_round_trip_is_the_grid_value_the_bracket_was_chosen_by():
    """exp(log(0.1)) is 0.10000000000000002: the root finder must meet the bracket's ends as the values that
    chose it, not the simulator run again a hair away, where a ratio that is not continuous (a fixed point
    stopped at its cap) may lie on the other side; it raised "f(a) and f(b) must have different signs" after
    a paper-scale prediction's 17 minutes of work."""
    assert math.exp(math.log(0.1)) != 0.1

    def step(
        x: float,
    ) -> float:  # below 1 only at exactly 0.1: the one crossing lies between 0.1 and the midpoint
        return 0.5 if x == 0.1 else 1.5

    (root,) = crossings(step, [0.1, 1.0])
    assert 0.1 <= root <= math.sqrt(0.1)


@pytest.fixture(scope="module")
def small():
    """WAGMA-SGD against Allreduce-SGD at P = 16, a log-normal spread of 0.3: cheap, and it crosses 1."""
    base = Inputs(
        dataclasses.replace(preset("resnet50"), sigma=0.3),
        load_network("daint", []),
        NoImbalance(None, 0),
        {},
        0,
        1,
    )

    def predict(inputs):
        return {
            16: {
                o: {
                    "throughput": simulate(
                        SimConfig(o, 16, inputs.workload, inputs.network, steps=40, control_every=0, seed=1)
                    ).throughput,
                    "time_to_target_s": None,
                }
                for o in ("wagma", "allreduce")
            }
        }

    knobs = [k for k in KNOBS if k.name in ("spread", "bandwidth")]
    sensitivity = [
        {
            "knob": k.name,
            "says": k.says,
            "value": v,
            "factor": k.factor,
            "base": 1.0,
            "predicted": predict(k.apply(base, v)),
        }
        for k in knobs
        for v in k.grid
    ]
    return base, predict, knobs, sensitivity, find_flips(predict, base, sensitivity, "wagma")


def test_the_simulator_run_at_each_stated_flip_ties_within_001(small):
    base, predict, knobs, _, flips = small
    stated = [(f["knob"], x) for f in flips for x in f["crossings"]]
    assert stated, "the case must cross 1 somewhere (else this test tests nothing)"
    for name, x in stated:
        knob = next(k for k in knobs if k.name == name)
        rows = predict(knob.apply(base, x))[16]  # a fresh run, not the root finder's cached one
        assert rows["wagma"]["throughput"] / rows["allreduce"]["throughput"] == pytest.approx(
            1.0, abs=0.01
        ), (name, x)


def test_claims_read_the_root_found_crossings_and_the_structural_range(small):
    _, _, _, sensitivity, flips = small
    data = {"sensitivity": sensitivity, "flips": flips}
    ask = {
        "subject": "wagma",
        "comparators": ["allreduce", "sgp"],
        "metric": "throughput",
        "lower_is_better": False,
    }
    spread = next(f for f in flip_points(data, 16, **ask) if f["knob"] == "spread")
    assert spread["found_by"] == "root finding"
    assert spread["crossings"] == next(f["crossings"] for f in flips if f["knob"] == "spread")
    assert (
        next(f for f in flip_points({"sensitivity": sensitivity}, 16, **ask) if f["knob"] == "spread")[
            "found_by"
        ]
        == "grid interpolation"
    )
    # the structural range: the ratio over every combination; spanning 1 is "undetermined"
    combos = [
        {"choice": {"barrier": b}, "predicted": p["predicted"]}
        for b, p in zip(("none", "every 10"), sensitivity[:2])
    ]
    data["structures"] = {
        "evaluated": [{"name": "barrier", "alternatives": ["none", "every 10"]}],
        "predictions": combos,
    }
    sr = structural_range(data, 16, **ask)
    lo, hi = sr["range"]
    assert lo < 1 < hi and undetermined(sr) and sr["structures"] == ["barrier: none | every 10"]
    assert "undetermined at the paper's scale" in structure_said(sr, 1.0)
    assert structural_range({"sensitivity": sensitivity}, 16, **ask) is None


@pytest.mark.long
def test_every_flip_stated_for_the_committed_resnet50_claims_ties_when_run(monkeypatch):
    """The claims' own flips (reproduce/claims/paper-scale/resnet50, P = 64): each crossing in its
    interval.json, run again from the folder's command with that one assumption moved, ties within 0.01."""
    root = Path(__file__).resolve().parents[1]
    folder = root / "reproduce" / "claims" / "paper-scale" / "resnet50"
    tuned = "reproduce/tuning/results-2core-20261205/resnet_independent"
    monkeypatch.chdir(root)
    req, _ = parse(
        [
            "cluster=daint", "workload=resnet", "data=imagenet", "gpus=64",
            "optimizer=glob(*,exclude=dropcompute)", "imbalance=independent",
            "train.max_rounds=500", "control_every=0",
            "--measured", "reproduce/scaling/results-2core-20261206/measured-cpu.json",
            "--convergence", tuned, "--compute-from", tuned, "--out", "unused",
        ]
    )  # fmt: skip
    runs = compose_runs(req)
    workload, network = model_inputs(req, runs, None, None)
    first = next(iter(runs.values()))
    imbalance = make_imbalance(first.imbalance, first.seed)
    base = Inputs(workload, network, imbalance, samples_to_target(req.convergence), 0, first.seed)
    data = json.loads((folder / "interval.json").read_text())
    stated = [f for f in data["flips"] if int(f["world"]) == 64 and f["crossings"]]
    assert "flips" in data
    for flip in stated:
        knob = next(k for k in KNOBS if k.name == flip["knob"])
        for x in flip["crossings"]:
            inputs = knob.apply(base, x)
            rows = {}
            for name, run in runs.items():
                res = simulate(
                    sim_config(
                        run, 64, inputs.workload, inputs.network, inputs.imbalance, req.steps, 0, inputs.seed
                    )
                )
                stt = inputs.samples_to_target.get(name)
                rows[name] = {
                    "throughput": res.throughput,
                    "time_to_target_s": stt / res.throughput if stt else None,
                }
            lower = flip["metric"] == "time_to_target_s"
            ratio = claim_ratio(rows, flip["subject"], flip["comparators"], flip["metric"], lower)[0]
            assert ratio == pytest.approx(1.0, abs=0.01), (flip["knob"], flip["metric"], x)
