"""Figures in the docs that a command generates from committed results: the text must equal the command's
output (a table changed by hand, or a new result committed without regenerating the text, fails here). The
claims table of docs/claims.md and the README's verdicts have their own test (tests/test_claims.py)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from tests.cli_util import load_script

ROOT = Path(__file__).resolve().parents[1]
CLAIMS_PAGE = ROOT / "docs" / "claims.md"  # the claims' figures and the other measurements, once the README's
STRAGGLERS = ROOT / "reproduce" / "imbalance" / "results-2core-20261201-divide-first-idle.json"


def _bench():
    return load_script(ROOT / "reproduce" / "imbalance" / "bench.py")


def _block(page: Path, name: str) -> str:
    """The text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in ``page`` (the test fails without
    them)."""
    block = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", page.read_text(), re.DOTALL)
    assert block, f"{page.relative_to(ROOT)} has no <!-- {name}:begin --> ... <!-- {name}:end --> block"
    return block.group(1)


def test_straggler_table_is_the_bench_scripts_table_of_the_committed_run():
    rows = json.loads(STRAGGLERS.read_text())
    doc = ROOT / "docs" / "benchmarks.md"
    assert _block(doc, "bench") == _bench().table(rows), (
        "docs/benchmarks.md differs from `reproduce/imbalance/bench.py --table "
        f"{STRAGGLERS.relative_to(ROOT)}`"
    )
    assert STRAGGLERS.name in doc.read_text()


def test_claims_page_straggler_figures_are_the_committed_runs():
    p4 = next(r for r in json.loads(STRAGGLERS.read_text()) if (r["P"], r["k"]) == (4, 1))
    bullet = next(line for line in CLAIMS_PAGE.read_text().split("\n- ") if line.startswith("**Stragglers**"))
    said = " ".join(bullet.split())
    assert f"{p4['wagma_of_mean_bound']:.2f} of the mean-speed bound" in said
    assert f"{p4['wagma_over_allreduce']:.2f}x Allreduce-SGD" in said
    assert f"the bound is {p4['bound_ratio']:.2f}x" in said


STARTUP = [
    ROOT / "reproduce" / "startup" / name
    for name in (
        "results-2core-20261202-before.json",
        "results-2core-20261202.json",
        "results-2core-20261202-server-first.json",
        "results-2core-20261204-before.json",
        "results-2core-20261204.json",
        "results-2core-20261204-gc.json",
    )
]


def test_claims_page_startup_table_is_the_bench_scripts_table_of_the_committed_runs():
    table = load_script(ROOT / "reproduce" / "startup" / "bench.py").table(
        [json.loads(p.read_text()) for p in STARTUP]
    )
    assert _block(CLAIMS_PAGE, "startup") == table, (
        "docs/claims.md differs from `reproduce/startup/bench.py --table "
        + " ".join(str(p.relative_to(ROOT)) for p in STARTUP)
        + "`"
    )


def test_engine_page_compute_gap_table_is_the_scripts_table_of_the_committed_run():
    result = ROOT / "reproduce" / "engine" / "results-2core-20261202.json"
    table = load_script(ROOT / "reproduce" / "engine" / "compute_gap.py").table(
        json.loads(result.read_text())["rows"]
    )
    doc = ROOT / "docs" / "wait-avoiding-engine.md"
    assert _block(doc, "compute-gap") == table, (
        f"the page differs from `reproduce/engine/compute_gap.py --table {result.relative_to(ROOT)}`"
    )
    assert result.name in doc.read_text()


def test_after_wagma_tables_are_the_scripts_tables_of_the_committed_tunings():
    assert (
        _block(ROOT / "docs" / "optimizers.md", "after-wagma")
        == load_script(ROOT / "reproduce" / "tuning" / "after_wagma.py").tables()
    ), "docs/optimizers.md differs from `reproduce/tuning/after_wagma.py`"


def test_transformer_spread_table_is_the_scripts_table_of_the_committed_study():
    result = ROOT / "reproduce" / "transformer" / "results-2core-20261205-spread" / "spread.json"
    table = load_script(ROOT / "reproduce" / "transformer" / "spread.py").table(
        json.loads(result.read_text())
    )
    doc = ROOT / "docs" / "claims.md"
    assert _block(doc, "spread") == table, (
        f"docs/claims.md differs from `reproduce/transformer/spread.py table {result.relative_to(ROOT)}`"
    )
    assert result.parent.name in doc.read_text()


def test_paired_bootstrap_table_is_the_scripts_table_of_the_committed_sources():
    table = load_script(ROOT / "reproduce" / "claims" / "paired.py").table()
    assert _block(ROOT / "docs" / "claims.md", "paired") == table, (
        "docs/claims.md differs from `.venv/bin/python reproduce/claims/paired.py`"
    )


VALIDATION = ROOT / "reproduce" / "scaling" / "results-2core-20261206"


def test_simulator_validation_table_is_the_scripts_table_of_the_committed_runs():
    script = load_script(ROOT / "reproduce" / "scaling" / "validation_table.py")
    rows = json.loads((VALIDATION / "validation.json").read_text())
    for page in (ROOT / "reproduce" / "scaling" / "README.md", ROOT / "docs" / "simulator.md"):
        assert _block(page, "validation") == script.table(rows), (
            f"{page.relative_to(ROOT)} differs from `reproduce/scaling/validation_table.py --table "
            f"{VALIDATION.relative_to(ROOT)}`"
        )
    labels = {r["label"] for r in rows}
    assert len(labels) == 9 and {(r["imbalance"], r["world_size"]) for r in rows} == {
        (i, p) for i in ("none", "independent", "lognormal") for p in (2, 4, 8)
    }
    assert len(rows) == 81


def test_the_committed_validation_rows_are_what_calibration_makes_of_the_committed_runs(tmp_path):
    """A row per optimizer recomputed from its committed run and comm-bench (the simulator is
    deterministic)."""
    from wagma_bench.cli.simulate import main as simulate_main

    rows = json.loads((VALIDATION / "validation.json").read_text())
    picked = {r["label"]: r for r in rows if (r["imbalance"], r["world_size"]) == ("independent", 4)}
    runs = tmp_path / "runs"
    runs.mkdir()
    for label in picked:
        shutil.copytree(VALIDATION / "runs" / f"{label}_independent_p4", runs / f"{label}_independent_p4")
    assert (
        simulate_main(
            [
                "cluster=local",
                "--calibrate",
                str(runs),
                str(VALIDATION / "comm_bench.json"),
                "--out",
                str(tmp_path / "sim"),
            ]
        )
        == 0
    )
    got = {
        Path(r["run"]).name.rsplit("_independent", 1)[0]: r
        for r in json.loads((tmp_path / "sim" / "validation.json").read_text())
    }
    for label, row in picked.items():
        assert (got[label]["predicted"], got[label]["predicted_trace"]) == (row["resampled"], row["trace"]), (
            label
        )


BENCH = ROOT / "reproduce" / "scaling" / "bench-simulator-2core-20261206.json"


def test_simulator_speed_table_is_the_bench_scripts_table_of_the_committed_run():
    table = load_script(ROOT / "reproduce" / "scaling" / "bench_simulator.py").table(
        json.loads(BENCH.read_text())
    )
    for page in (ROOT / "reproduce" / "scaling" / "README.md", ROOT / "docs" / "simulator.md"):
        assert _block(page, "simulator-speed") == table, (
            f"{page.relative_to(ROOT)} differs from `reproduce/scaling/bench_simulator.py --table "
            f"{BENCH.relative_to(ROOT)}`"
        )


def test_measured_inputs_table_is_the_scripts_table_of_the_committed_file():
    script = load_script(ROOT / "reproduce" / "scaling" / "measure_inputs.py")
    data = json.loads((VALIDATION / "measured-cpu.json").read_text())
    assert _block(ROOT / "reproduce" / "scaling" / "README.md", "measured") == script.table(data), (
        "reproduce/scaling/README.md differs from `reproduce/scaling/measure_inputs.py --show "
        f"{(VALIDATION / 'measured-cpu.json').relative_to(ROOT)}`"
    )


BENCH_BEFORE = ROOT / "reproduce" / "scaling" / "bench-simulator-2core-20261206-before-4e3a308.json"


def test_simulator_speed_before_and_after_is_the_committed_interleaved_run():
    script = load_script(ROOT / "reproduce" / "scaling" / "bench_simulator.py")
    result = json.loads(BENCH_BEFORE.read_text())
    rows = [r for r in result["rows"] if r["world_size"] == 1024]
    said = (
        f"At 1,024 ranks all eight models took {sum(r['before_cpu_s'] for r in rows):.0f} s before and "
        f"{sum(r['cpu_s'] for r in rows):.1f} s now"
    )
    wagma = next(
        r
        for r in json.loads(BENCH.read_text())["rows"]
        if (r["optimizer"], r["world_size"]) == ("wagma", 65536)
    )
    page = ROOT / "reproduce" / "scaling" / "README.md"  # (docs/simulator.md keeps only the current figures)
    assert _block(page, "simulator-speed-before") == script.table(result)
    assert said in " ".join(page.read_text().split())
    for page in (ROOT / "reproduce" / "scaling" / "README.md", ROOT / "docs" / "simulator.md"):
        text = " ".join(page.read_text().split())
        assert f"WAGMA-SGD at 65,536 ranks takes {wagma['cpu_s']:.1f} s" in text


def test_claims_page_simulator_figures_are_the_committed_validation_and_measurement():
    script = load_script(ROOT / "reproduce" / "scaling" / "validation_table.py")
    rows = json.loads((VALIDATION / "validation.json").read_text())
    trace, resampled = script.misses(rows)
    # the bullet quotes c as measured directly (reproduce/scaling/adpsgd_cost/measure_c.py)
    c = json.loads((VALIDATION / "measured-cpu.json").read_text())["gossip_cost"]
    wagma = next(
        r
        for r in json.loads(BENCH.read_text())["rows"]
        if (r["optimizer"], r["world_size"]) == ("wagma", 65536)
    )
    bullet = " ".join(
        next(b for b in CLAIMS_PAGE.read_text().split("\n- ") if b.startswith("**Simulator**")).split()
    )
    assert f"trace within 5% in {len(rows) - trace} of {len(rows)}" in bullet
    assert f"resampled within 15% in {len(rows) - resampled} of {len(rows)}" in bullet
    assert f"c = {c['value']:.2f}, 95% interval {c['interval'][0]:.2f} to {c['interval'][1]:.2f}" in bullet
    assert f"65,536 ranks simulates in {wagma['cpu_s']:.1f} s" in bullet


def test_the_interval_cost_quoted_is_the_committed_timing():
    timing = json.loads((ROOT / "reproduce" / "scaling" / "interval-timing-2core-20261206.json").read_text())
    text = " ".join((ROOT / "docs" / "simulator.md").read_text().split())
    assert (
        f"at {timing['world_size']:,} ranks ({timing['optimizers']} optimizers, {timing['rounds']} rounds, "
        f"`--interval {timing['replicates']}`) took {timing['took_s']:.0f} s"
    ) in text


def test_the_pooled_interval_cost_quoted_is_the_committed_bench_row():
    """simulate --interval in processes (docs/simulator.md): the committed bench row's wall and CPU seconds,
    and those of the code before, timed right after it."""
    bench = ROOT / "reproduce" / "scaling" / "bench-interval-pool-2core-20261207.json"
    (row,) = [r for r in json.loads(bench.read_text())["rows"] if r.get("case") == "interval"]
    text = " ".join((ROOT / "docs" / "simulator.md").read_text().split())
    assert (
        f"took {row['wall_s']:.0f} s wall and {row['cpu_s']:.0f} CPU s in {row['jobs']} processes, where the "
        f"code before took {row['before_wall_s']:.0f} s wall ({row['before_cpu_s']:.0f} CPU s)"
    ) in text
    assert f"bought {row['before_wall_s'] / row['wall_s']:.2f}x in wall time" in text
    idle = json.loads(bench.with_name("bench-interval-pool-2core-idle-20261207.json").read_text())["rows"][0]
    before = json.loads(bench.with_name("bench-adpsgd-speed-2core-idle-20261207.json").read_text())["rows"][
        -1
    ]
    assert before["case"] == idle["case"] == "interval"
    assert (
        f"it took {idle['wall_s']:.0f} s wall and {idle['cpu_s']:.0f} CPU s" in text
        and f"{before['wall_s'] / idle['wall_s']:.2f}x faster than the code before's {before['wall_s']:.0f} s"
        in text
    )


def test_the_resampled_miss_quotes_the_delayed_ranks_compute_of_the_committed_runs():
    script = load_script(ROOT / "reproduce" / "scaling" / "validation_table.py")
    text = " ".join((ROOT / "docs" / "simulator.md").read_text().split())
    ar = script.delayed_compute(VALIDATION / "runs" / "allreduce_lognormal_p8")
    wg = script.delayed_compute(VALIDATION / "runs" / "wagma_lognormal_p8")
    assert f"computed in {ar[0]:.3f} s (median) against {ar[1]:.3f} s for the others" in text
    assert f"took {wg[0]:.3f} s against {wg[1]:.3f} s" in text


def test_the_trace_misses_quote_the_recorded_and_modelled_waits_of_the_committed_runs():
    script = load_script(ROOT / "reproduce" / "scaling" / "validation_table.py")
    text = " ".join((ROOT / "docs" / "simulator.md").read_text().split())
    bench = VALIDATION / "comm_bench.json"
    ms = {
        name: tuple(round(1e3 * v) for v in script.comm_gap(VALIDATION / "runs" / name, bench))
        for name in ("allreduce_none_p8", "eager_none_p8", "dropcompute_lognormal_p8", "wagma_none_p8")
    }
    assert (
        "Allreduce-SGD {} ms a step recorded against {} ms modelled".format(*ms["allreduce_none_p8"]) in text
    )
    assert (
        "eager-SGD {} against {}, DropCompute (`lognormal`) {} against {}".format(
            *ms["eager_none_p8"], *ms["dropcompute_lognormal_p8"]
        )
        in text
    )
    assert "({} against {})".format(*ms["wagma_none_p8"]) in text


POWER = ROOT / "reproduce" / "claims" / "power.json"


def _power():
    return load_script(ROOT / "reproduce" / "claims" / "power.py")


def test_power_table_is_the_scripts_table_of_the_committed_run():
    assert _block(ROOT / "docs" / "claims.md", "power") == _power().table(json.loads(POWER.read_text())), (
        "docs/claims.md differs from `.venv/bin/python reproduce/claims/power.py table`"
    )


def test_the_power_tables_spread_is_the_interquartile_range_however_many_trials_missed():
    """A miss (inf) beyond the upper quartile leaves the quartiles finite: numpy's linear interpolation gives
    nan there (0 x inf), which read as a spread of inf and reached power.json as null."""
    spread = _power().spread
    inf = math.inf
    assert spread([1, 2, 3, 4, 5, 6, 7, inf, inf], difference=False) == (7 - 3) / 5  # q3 at the 7th of 9
    assert spread([1, 2, 3, 4, 5, 6, 7, inf, inf], difference=True) == 4
    assert spread([1, 2, 3, 4, 5, 6, inf, inf, inf], difference=False) == inf  # the upper quartile a miss
    assert spread([1, 2, 3, 4], difference=True) == 3.25 - 1.75  # between two trials: interpolated


def test_an_infinite_spread_reads_back_from_power_json_as_infinite():
    """A spread of inf (a quartile on a miss) is written as null (strict JSON has no infinity) and the table
    read back from power.json prints it as ∞: the re-tuned sentence-batch folder (3 of 9 WAGMA-SGD trials
    missed) stopped `power.py table` with a TypeError on None."""
    from wagma_bench.record.files import strict_json

    script = _power()
    row = {
        "claim": "c",
        "design": [3, 3],
        "best_comparator": "allreduce",
        "spread": {"subject": math.inf, "best": 0.5},
        "power": {k: [0.0, 0.1] for k in ("3x3", "5x5", "10x10")},
    }
    read_back = json.loads(strict_json({"claims": [row]}))
    assert read_back["claims"][0]["spread"]["subject"] is None
    assert script.table(read_back).splitlines()[-1] == (
        "| `c` | 3 x 3 | ∞ / 0.50 (allreduce) | 0.00 / 0.10 | 0.00 / 0.10 | 0.00 / 0.10 |"
    )


def test_the_committed_power_run_read_the_committed_sources():
    """The trials each row was simulated from are the claim's committed trials now (a re-tuned source, or a
    claim switched to another folder, makes power.json stale: `power.py run` again)."""
    from wagma_bench.analysis.claims import find_sources, load_claims

    script, committed = _power(), json.loads(POWER.read_text())
    sources = find_sources(
        [ROOT / line.strip() for line in (ROOT / "reproduce/claims/sources").read_text().split()]
    )
    now = {}
    for c in load_claims():
        tune_dir = sources.tunings[c.measured["tuning"]]
        data = script.trials(tune_dir, c.metric)
        now[c.id] = {
            "source": str(tune_dir.relative_to(ROOT)),
            "trials": {n: sum(map(len, data[n])) for n in [c.subject, *c.comparators] if n in data},
        }
    assert script.inputs(committed) == now, (
        "reproduce/claims/power.json is stale: run reproduce/claims/power.py run"
    )


def test_claims_page_names_the_claims_this_machine_can_decide():
    said = " ".join(CLAIMS_PAGE.read_text().split())
    m = re.search(
        r"at 10 x 10 studies x trials only (.+?) reach(?:es)? a probability of ([\d.]+) that (?:its|their) "
        r"interval",
        said,
    )
    assert m, "docs/claims.md no longer says which claims 10 x 10 would decide"
    script = _power()
    assert re.findall(r"`([\w-]+)`", m.group(1)) == script.decidable(json.loads(POWER.read_text()))
    assert float(m.group(2)) == script.DECIDES


@pytest.mark.long
def test_the_committed_power_table_is_what_the_script_computes():
    """The simulation again from the committed sources (about 15 s on the 2-core machine): the same seed, the
    same table."""
    script = _power()
    assert script.table(script.compute()) == script.table(json.loads(POWER.read_text()))
