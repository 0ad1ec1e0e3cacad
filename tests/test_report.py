"""`wagma-bench report`, the W&B mirror and MLPerf log lines.

Hand-written runs with known numbers check the statistics exactly; one real 2-rank run (module-scoped,
shared by the tests that need it) checks the path from the trainer's files to the report, W&B offline
and the ``:::MLLOG`` lines printed with ``logger.mllog=true``.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from wagma_bench.analysis import plots, report, run_records, scoring, step_times
from wagma_bench.cli import report as report_cli
from wagma_bench.record.events import summarize
from wagma_bench.record.files import write_json_atomic
from wagma_bench.record.loggers import has_api_key, resolve_mode, sweep_group

PNG = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parent.parent


# --- hand-written runs -------------------------------------------------------------------------------


def write_run(
    d: Path,
    optimizer: str,
    seed: int,
    curve: list[tuple[int, float, float]],
    *,
    target=0.9,
    world=4,
    workload="resnet",
    imbalance="none",
    samples_per_step=128,
    crashed=False,
    step_ranks: dict[int, float] | None = None,
    settings: dict | None = None,
) -> Path:
    """A run directory as the trainer writes it; ``curve``: (step, train_s, metric) per evaluation;
    ``settings``: the optimizer section of its config (beside its name)."""
    d.mkdir(parents=True)
    t0 = 1.7e12
    events = [
        {
            "key": "run_start",
            "value": None,
            "time_ms": t0,
            "metadata": {
                "workload": workload,
                "data": "mnist5k",
                "optimizer": optimizer,
                "imbalance": imbalance,
                "world_size": world,
                "seed": seed,
                "metric": "top1",
                "target": target,
                "eval_model": "local",
                "global_batch_size": samples_per_step,
                "train_samples": 4500,
                "config": {"seed": seed, "optimizer": {"name": optimizer, **(settings or {})}},
                "hosts": ["a"],
                "versions": {"torch": "x"},
                "git_sha": "abc",
                "config_hash": "h",
            },
        }
    ]
    for step, train_s, value in curve:
        events.append(
            {
                "key": "eval_accuracy",
                "value": value,
                "time_ms": t0 + 1000 * train_s,
                "metadata": {
                    "step": step,
                    "epoch": step / 10,
                    "samples": step * samples_per_step,
                    "train_s": train_s,
                    "wall_s": train_s + 1,
                    "eval_s": 1.0,
                },
            }
        )
    last = curve[-1]
    if not crashed:
        events.append(
            {
                "key": "run_stop",
                "value": None,
                "time_ms": t0 + 1000 * last[1] + 1,
                "metadata": {
                    "status": "completed",
                    "step": last[0],
                    "samples": last[0] * samples_per_step,
                    "train_s": last[1],
                    "wall_s": last[1] + 1,
                    "eval_s": 1.0,
                },
            }
        )
    lines = [json.dumps(e) for e in events]
    text = "\n".join(lines) + "\n"
    if crashed:  # killed while writing a progress event: torn last line, no run_stop, no summary.json
        text += '{"key": "progress", "value": null, "met'
    (d / "events.jsonl").write_text(text)
    if not crashed:
        write_json_atomic(d / "summary.json", summarize(events))
    steps = d / "steps"
    steps.mkdir()
    for rank, delay in (step_ranks or {0: 0.0, 1: 0.3}).items():
        recs = [
            {
                "local_step": s,
                "round": s,
                "t": 0.1 * s,
                "compute_s": 0.1,
                "delay_s": delay,
                "comm_s": 0.01 * (s % 3),
                "samples": 32,
                "loss": 1.0,
                "staleness": 0,
            }
            for s in range(1, 21)
        ]
        (steps / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def reach_at(t: float | None, steps: int = 100) -> list[tuple[int, float, float]]:
    """A curve reaching 0.9 at training time ``t`` (never when None), with evaluations every 10 s."""
    end = 60.0 if t is None else t
    pts = [(int(steps * s / end), s, 0.5 + 0.3 * s / end) for s in (end / 3, 2 * end / 3)]
    return pts + [(steps, end, 0.95 if t is not None else 0.85)]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A sweep directory laid out as Hydra's multirun writes it, with known times-to-target."""
    root = tmp_path_factory.mktemp("sweep")
    (root / "multirun.yaml").write_text("hydra: {}\n")
    known = {"allreduce": [10, 12, 14, 40], "wagma": [5, 6, 9], "local_sgd": [8, None], "dpsgd": [7, 9, None]}
    n = 0
    for opt, times in known.items():
        for seed, t in enumerate(times, start=1):
            write_run(root / f"{n}_{opt}_s{seed}", opt, seed, reach_at(t))
            n += 1
    write_run(root / f"{n}_wagma_other_target", "wagma", 1, reach_at(5), target=0.95)
    write_run(root / f"{n + 1}_sgp_crashed", "sgp", 1, reach_at(None)[:2], crashed=True)
    write_run(root / f"{n + 2}_transformer", "allreduce", 1, reach_at(3), workload="transformer")
    return root


def rows_by_optimizer(runs) -> dict[str, dict]:
    return {r["optimizer"]: r for r in report.series_rows(runs)}


def test_olympic_mean_and_median():
    assert report.olympic_mean([1.0, 2.0, 3.0, 4.0, 100.0]) == 3.0
    assert report.olympic_mean([4.0, 2.0, 3.0]) == 3.0
    assert report.olympic_mean([5.0, 7.0]) == 6.0  # < 3 seeds: plain mean
    assert report.olympic_mean([5.0, math.inf]) is None  # a missing seed cannot be dropped
    assert report.olympic_mean([5.0, 6.0, math.inf]) == 6.0  # ... but with 3 it is the slowest, dropped
    assert report.olympic_mean([5.0, math.inf, math.inf]) is None
    assert report.olympic_mean([]) is None
    assert report.median([1.0, 3.0, math.inf]) == 3.0
    assert report.median([1.0, math.inf]) is None


def test_time_to_target_table_exact(sweep):
    runs = [run_records.load_run(d) for d in run_records.find_runs([sweep])]
    groups = run_records.group_runs(runs)
    assert set(groups) == {
        ("resnet", "mnist5k", "top1", 0.9),
        ("resnet", "mnist5k", "top1", 0.95),
        ("transformer", "mnist5k", "top1", 0.9),
    }
    rows = rows_by_optimizer(groups[("resnet", "mnist5k", "top1", 0.9)])
    ar, wg, ls, dp = rows["allreduce"], rows["wagma"], rows["local_sgd"], rows["dpsgd"]
    assert (ar["ttt_median_s"], ar["ttt_olympic_s"]) == (13.0, 13.0)  # median of 4; (12 + 14) / 2
    assert (wg["ttt_median_s"], wg["ttt_olympic_s"]) == (6.0, 6.0)
    assert wg["speedup_ttt"] == pytest.approx(13.0 / 6.0, rel=1e-12)
    assert (ls["reached"], ls["seeds"], ls["ttt_median_s"], ls["ttt_olympic_s"]) == (1, 2, None, None)
    assert ls["speedup_ttt"] is None and ls["olympic_rule"] == "plain mean (< 3 seeds)"
    assert (dp["reached"], dp["ttt_median_s"], dp["ttt_olympic_s"]) == (2, 9.0, 9.0)
    assert dp["speedup_ttt"] == pytest.approx(13.0 / 9.0)
    assert (ar["ttt_min_s"], ar["ttt_max_s"]) == (10.0, 40.0)
    # throughput = samples / train_s = 100 * 128 / t, median over seeds
    assert ar["throughput"] == pytest.approx((12800 / 12 + 12800 / 14) / 2)
    assert wg["speedup_throughput"] == pytest.approx(wg["throughput"] / ar["throughput"])
    assert ar["final_metric"] == 0.95 and ls["best_metric"] == pytest.approx((0.95 + 0.85) / 2)
    # the crashed run is in the same group and marked, not dropped
    assert rows["sgp"]["partial_runs"] == 1 and rows["sgp"]["reached"] == 0


def test_crashed_run_is_read_and_marked(sweep):
    run = run_records.load_run(next(sweep.glob("*_sgp_crashed")))
    assert run.partial and run.summary.status == "incomplete"
    assert any("torn" in p for p in run.problems) and any("summary.json" in p for p in run.problems)
    assert any("run_stop" in p for p in run.problems)
    assert len(run.evals) == 2 and run.meta["optimizer"] == "sgp"


def test_report_files(sweep, tmp_path):
    out = tmp_path / "R"
    assert report_cli.main([str(sweep), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    for title in (
        "resnet / mnist5k — top1 ≥ 0.9\n",
        "resnet / mnist5k — top1 ≥ 0.95",
        "transformer / mnist5k",
    ):
        assert title in md
    assert md.count("### Comparison") == 3  # never mixed in one table
    assert "not reached" in md and "no run_stop event" in md and "torn last line" in md
    assert "| local_sgd | 4 | none | 2 | 1 | not reached | — | not reached |" in md
    assert "| wagma | 4 | none | 3 | 3 | 6.00 | [5.00, 9.00] | 6.00 | 2.17× |" in md  # seeds: 5, 6, 9 s
    slug = "resnet_mnist5k_top1_0.9"
    for fig in ("metric", "time_to_target", "throughput", "step_times"):
        data = (out / f"{slug}_{fig}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, fig
        assert f"({slug}_{fig}.png)" in md
    assert (out / "comparison.csv").read_text().count("\n") == 1 + 5 + 1 + 1  # header + series of 3 groups
    assert report_cli.main([str(tmp_path / "nothing-here")]) == 2


def test_seed_band_and_step_rows(sweep):
    xs, med, lo, hi = report.seed_band(
        [([1, 2, 3], [0.0, 1.0, 2.0]), ([1, 2, 3], [2.0, 3.0, 4.0]), ([1, 2, 3], [1.0, 5.0, 0.0])]
    )
    assert (xs, med, lo, hi) == ([1, 2, 3], [1.0, 3.0, 2.0], [0.0, 1.0, 0.0], [2.0, 5.0, 4.0])
    xs, med, lo, hi = report.seed_band([([0, 10], [0.0, 10.0]), ([0, 5], [0.0, 0.0])], points=11)
    assert xs[5] == 5.0 and med[5] == 2.5 and (lo[5], hi[5]) == (0.0, 5.0)
    assert xs[-1] == 10.0 and (med[-1], lo[-1], hi[-1]) == (5.0, 0.0, 10.0)  # the shorter seed holds its end
    run = run_records.load_run(next(sweep.glob("0_allreduce_s1")))
    rows = step_times.step_time_rows([run])
    assert len(rows) == 2 * 20 * 3
    s = step_times.step_time_summary(rows)
    assert s["slowest_rank"] == 1 and s["compute_median_s"] == 0.1 and s["delay_median_s"] == 0.15


def test_throughput_plot_takes_predictions(tmp_path):
    """The format the simulator reuses: measured and predicted rows in one tidy table, one figure."""
    table = [
        {"label": "allreduce", "world_size": p, "throughput": 100.0 * p**0.9, "kind": "measured"}
        for p in (2, 4, 8)
    ]
    table += [
        {"label": "allreduce", "world_size": p, "throughput": 95.0 * p**0.9, "kind": "predicted"}
        for p in (2, 4, 8, 1024)
    ]
    path = plots.plot_throughput(table, tmp_path / "t.png", "measured vs predicted")
    assert path.read_bytes().startswith(PNG)


def test_a_png_figure_is_a_palette_image_true_to_its_render(tmp_path):
    """plots.save writes a PNG in 256 colours (plots.write_png): each pixel within a few levels of
    matplotlib's own 32-bit render of the same figure (antialiased edges move most), in under half its
    bytes."""
    import io

    import numpy as np
    from PIL import Image

    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for i in range(8):  # more colours than a report's figure has, and their antialiased blends
        ax.plot(range(50), [x * (i + 1) ** 0.5 for x in range(50)], label=f"series {i}")
    ax.legend()
    render, palette = io.BytesIO(), io.BytesIO()
    fig.savefig(render, format="png", dpi=plots.DPI)
    plots.write_png(fig, palette)
    path = plots.save(fig, tmp_path / "f.png")
    assert Image.open(path).mode == "P"
    a = np.asarray(Image.open(render).convert("RGB"), dtype=int)
    b = np.asarray(Image.open(palette).convert("RGB"), dtype=int)
    assert a.shape == b.shape
    diff = np.abs(a - b)
    assert diff.max() <= 24 and diff.mean() < 0.5, (diff.max(), diff.mean())
    assert len(palette.getvalue()) < len(render.getvalue()) / 2


# --- W&B and MLPerf logs (pure parts) ----------------------------------------------------------------


def test_wandb_online_without_a_key_is_refused_in_the_launching_process(tmp_path, monkeypatch):
    """The check `run` makes before it starts any rank (cli.run._run_job -> runtime.extras.check_extras), so
    the ranks never meet it on rank 0 after they are up."""
    from hydra import compose, initialize_config_dir

    from wagma_bench.config.schema import validate
    from wagma_bench.errors import ConfigError
    from wagma_bench.runtime.extras import check_extras

    empty = tmp_path / "netrc"
    empty.write_text("")
    monkeypatch.setenv("NETRC", str(empty))
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    with initialize_config_dir(
        config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"
    ):
        cfg = validate(compose(config_name="wagma", overrides=["logger=wandb", "logger.wandb.mode=online"]))
    with pytest.raises(ConfigError, match=r"logger.wandb.mode=online is not allowed without a W&B API key"):
        check_extras(cfg)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_extras(cfg)


def test_wandb_mode_and_group(tmp_path):
    empty = tmp_path / "netrc"
    empty.write_text("")
    assert resolve_mode("auto", {"NETRC": str(empty)}) == "offline"
    assert resolve_mode("auto", {"NETRC": str(empty), "WANDB_API_KEY": "k" * 40}) == "online"
    keyed = tmp_path / "netrc2"
    keyed.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    keyed.chmod(0o600)
    assert has_api_key({"NETRC": str(keyed)})
    assert resolve_mode("auto", {"NETRC": str(keyed), "WANDB_MODE": "offline"}) == "offline"
    with pytest.raises(ValueError, match="not allowed without a W&B API key"):
        resolve_mode("online", {"NETRC": str(empty)})
    with pytest.raises(ValueError, match="auto, offline, online"):
        resolve_mode("cloud", {})
    job = tmp_path / "multirun" / "2026-01-02" / "10-11-12" / "0_allreduce_s1"
    job.mkdir(parents=True)
    assert sweep_group(job) is None
    (job.parent / "multirun.yaml").write_text("{}")
    assert re.fullmatch(r"2026-01-02_10-11-12-[0-9a-f]{6}", sweep_group(job))
    slurm_run = tmp_path / "scaling" / "runs" / "allreduce_g8_s1"
    slurm_run.mkdir(parents=True)
    (tmp_path / "scaling" / "manifest.json").write_text("{}")
    assert re.fullmatch(r"scaling-[0-9a-f]{6}", sweep_group(slurm_run))
    other = tmp_path / "elsewhere" / "scaling" / "runs" / "allreduce_g8_s1"  # same name, another sweep
    other.mkdir(parents=True)
    (other.parent.parent / "manifest.json").write_text("{}")
    assert sweep_group(other) != sweep_group(slurm_run)
    # --submitit: one Hydra multirun per GPU count in SWEEP/runs/0008gpu, one group for the sweep
    jobs = [tmp_path / "sub" / "runs" / f"{g:04d}gpu" / "0_wagma_s1" for g in (8, 16)]
    for j in jobs:
        j.mkdir(parents=True)
        (j.parent / "multirun.yaml").write_text("{}")
    assert sweep_group(jobs[0]) == sweep_group(jobs[1]) and sweep_group(jobs[0]).startswith("sub-")


# --- a real run: trainer -> events -> W&B offline, MLLOG lines, report -------------------------------


class Listener:
    """A local TCP server that counts connections: W&B's base URL and the HTTP(S) proxies point at it, so
    any attempt to reach the network is seen (and fails)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def env(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.port}"
        return {
            "WANDB_BASE_URL": url,
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "",
            "no_proxy": "",
        }

    def close(self):
        self.sock.close()


def offline_env(tmp: Path, listener: Listener) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    (tmp / "netrc").write_text("")
    env.update(listener.env(), NETRC=str(tmp / "netrc"), HOME=str(tmp / "home"))  # no key anywhere
    (tmp / "home").mkdir(exist_ok=True)
    return env


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    listener = Listener()
    cwd = tmp / "cwd"
    cwd.mkdir()
    run_dir = tmp / "run"
    cmd = [
        sys.executable,
        "-m",
        "wagma_bench",
        "run",
        "launcher.nproc=2",
        "train.max_rounds=15",
        "eval.every_rounds=5",
        "logger=wandb",
        "logger.mllog=true",
        "logger.progress=off",
        "logger.wandb.per_rank_step_times=true",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(
        cmd, cwd=cwd, env=offline_env(tmp, listener), capture_output=True, text=True, timeout=300, check=False
    )
    listener.close()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        "dir": run_dir,
        "stdout": proc.stdout,
        "cwd": cwd,
        "home": tmp / "home",
        "net": listener.connections,
    }


@pytest.mark.slow
def test_real_run_wandb_offline_under_run_dir(real_run):
    run_dir = real_run["dir"]
    assert real_run["net"] == 0, "W&B tried to reach the network"
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    data = next(offline[0].glob("run-*.wandb")).read_bytes()
    assert b"eval/top1" in data and b"rank1/compute_s" in data  # rank 0 logged every rank's step times
    assert f"wandb sync {offline[0]}" in real_run["stdout"]
    assert not (real_run["cwd"] / "wandb").exists()
    assert not [p for p in real_run["home"].rglob("*") if "wandb" in p.name]


@pytest.mark.slow
def test_real_run_mllog_lines(real_run):
    """logger.mllog=true prints the MLPerf log that the run writes to RUN_DIR/mllog.txt."""
    printed = [line for line in real_run["stdout"].splitlines() if line.startswith(":::MLLOG ")]
    assert printed == (real_run["dir"] / "mllog.txt").read_text().splitlines()
    recs = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in printed]
    keys = [r["key"] for r in recs]
    for key in (
        "seed",
        "global_batch_size",
        "train_samples",
        "eval_samples",
        "run_start",
        "eval_accuracy",
        "run_stop",
    ):
        assert key in keys, key
    assert (
        keys.index("global_batch_size")
        < keys.index("run_start")
        < keys.index("eval_accuracy")
        < keys.index("run_stop")
    )
    by_key = {r["key"]: r for r in recs}
    assert by_key["global_batch_size"]["value"] == 64 and by_key["accelerators_per_node"]["value"] == 2
    assert by_key["run_stop"]["metadata"]["status"] == "aborted"  # 15 steps do not reach 97 %
    assert all(set(r) == {"namespace", "time_ms", "event_type", "key", "value", "metadata"} for r in recs)


@pytest.mark.slow
def test_real_run_summary_and_report(real_run, tmp_path):
    summary = json.loads((real_run["dir"] / "summary.json").read_text())
    assert {"torch", "comm", "wagma_bench"} <= set(summary["versions"]) and summary["hosts"]
    assert summary["git_sha"] is None or len(summary["git_sha"]) == 40
    out = tmp_path / "R"
    listener = Listener()
    env = offline_env(tmp_path, listener)
    proc = subprocess.run(
        [sys.executable, "-m", "wagma_bench", "report", str(real_run["dir"]), "--out", str(out), "--wandb"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    listener.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "report.md").read_text()
    assert "resnet / mnist5k — top1 ≥ 0.97" in md and "| allreduce | 2 | none | 1 | 0 | not reached |" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        f"resnet_mnist5k_top1_0.97_{f}.png" for f in ("metric", "step_times", "throughput", "time_to_target")
    ]
    assert all((out / p).read_bytes().startswith(PNG) for p in pngs)
    assert len(list((out / "wandb").glob("offline-run-*/run-*.wandb"))) == 1 and listener.connections == 0


def test_failed_and_resumed_runs_status(tmp_path):
    """The launcher's summary.json names a failure the events miss; a resume after run_stop reopens a run."""
    failed = write_run(tmp_path / "failed", "wagma", 1, reach_at(None)[:1], crashed=True)
    write_json_atomic(failed / "summary.json", {"status": "failed", "error": "rank 2 exited with code 1"})
    run = run_records.load_run(failed)
    assert run.summary.status == "failed" and run.summary.error == "rank 2 exited with code 1"
    assert run.partial and not any("summary.json" in p for p in run.problems)
    resumed = write_run(tmp_path / "resumed", "wagma", 1, reach_at(None))
    with open(resumed / "events.jsonl", "a") as f:
        f.write(
            json.dumps({"key": "run_resume", "value": None, "time_ms": 2e12, "metadata": {"step": 100}})
            + "\n"
        )
    run = run_records.load_run(resumed)
    assert run.summary.status == "incomplete" and "since its last resume" in run.problems[0]


def test_bleu_under_two_sacrebleu_signatures_is_flagged():
    """Two tokenisations give incomparable BLEU: the report names both instead of comparing silently."""
    runs = [
        run_records.RunRecord(
            Path(name), {}, [], {}, [], f"nrefs:1|case:mixed|eff:no|tok:{tok}|smooth:exp|version:2.6.0"
        )
        for name, tok in (("a", "13a"), ("b", "intl"))
    ]
    assert "2 different sacrebleu signatures" in report.signature_lines(runs)[0]
    assert report.signature_lines(runs[:1])[0] == f"BLEU: sacrebleu signature `{runs[0].signature}`."
    assert report.signature_lines([run_records.RunRecord(Path("c"), {}, [], {})]) == []


def test_runs_of_one_optimizer_with_other_settings_are_other_series_not_seeds(tmp_path):
    """Local SGD with period 4, and with period 2 and Nesterov's outer step: two configurations, two rows
    named by the settings that differ; two seeds of one configuration stay one row of two seeds. (Before, all
    three were one `local_sgd` row of three "seeds".)"""
    plain, outer = {"sync_period": 4, "outer": "none"}, {"sync_period": 2, "outer": "nesterov"}
    write_run(tmp_path / "a", "local_sgd", 1, reach_at(10.0), settings=plain)
    write_run(tmp_path / "b", "local_sgd", 2, reach_at(12.0), settings=plain)
    write_run(tmp_path / "c", "local_sgd", 1, reach_at(8.0), settings=outer)
    write_run(tmp_path / "d", "wagma", 1, reach_at(9.0), settings={"tau": 10})
    _, (group,), _ = report.make_report([tmp_path], tmp_path / "out")
    rows = {r["optimizer"]: r["seeds"] for r in group.comparison}
    assert rows == {
        "local_sgd (outer=none, sync_period=4)": 2,
        "local_sgd (outer=nesterov, sync_period=2)": 1,
        "wagma": 1,
    }


def _tuned_dir(d: Path, optimizer: str, fixed: dict, tuned: list[dict], times: list[float]) -> Path:
    """A tuning directory of one combination, one study: each trial's run_start (its optimizer section: the
    fixed settings and its own tuned ones) and summary."""
    trials = []
    for i, (point, t) in enumerate(zip(tuned, times, strict=True), 1):
        name = f"{optimizer}_study1_trial{i}"
        trials.append(
            {
                "name": name,
                "combo": optimizer,
                "study": 1,
                "trial": i,
                "seed": i,
                "params": point,
                "overrides": [],
                "gpus": 0,
            }
        )
        run = d / "trials" / name
        run.mkdir(parents=True)
        config = {"optimizer": {"name": optimizer, **fixed, **point}}
        (run / "events.jsonl").write_text(
            json.dumps(
                {
                    "key": "run_start",
                    "value": None,
                    "time_ms": 1.7e12,
                    "metadata": {"optimizer": optimizer, "config": config},
                }
            )
            + "\n"
        )
        (run / "summary.json").write_text(
            json.dumps(
                {
                    "status": "completed",
                    "optimizer": optimizer,
                    "workload": "resnet",
                    "data": "mnist5k",
                    "world_size": 4,
                    "imbalance": "paper",
                    "reached": True,
                    "time_to_target_s": t,
                }
            )
        )
    (d / "tune.json").write_text(
        json.dumps({"version": 1, "studies": 1, "trials_per_study": len(tuned), "seed": 1, "trials": trials})
    )
    return d


def test_two_tunings_of_one_optimizer_under_other_fixed_settings_are_two_tuned_rows(tmp_path):
    """Plain local SGD and streaming DiLoCo (local SGD with Nesterov's outer step and fragments) tuned over
    the same period range: two rows named by their fixed settings, each in the performance profile; the tuned
    setting (period) names neither. (Before, both were `local_sgd` and the profile kept one.)"""
    periods = [{"sync_period": 4}, {"sync_period": 8}]
    plain = _tuned_dir(
        tmp_path / "plain", "local_sgd", {"outer": "none", "fragments": 1}, periods, [20.0, 30.0]
    )
    streaming = _tuned_dir(
        tmp_path / "streaming", "local_sgd", {"outer": "nesterov", "fragments": 2}, periods, [25.0, 15.0]
    )
    section = scoring.tuned_section([plain, streaming], tmp_path / "out")
    names = {r["optimizer"]: r["score_s"] for r in section.rows}
    assert names == {
        "local_sgd (fragments=1, outer=none)": 20.0,
        "local_sgd (fragments=2, outer=nesterov)": 15.0,
    }
    profile, problems = scoring.performance_profile(section.rows)
    assert set(profile) == set(names) and problems == 1


def test_a_setting_some_runs_predate_does_not_name_a_variant():
    """A run logged before `fragments` existed ran at its default, which its record does not say: only the
    settings every run has tell the variants apart."""
    labels = run_records.variant_labels(
        [
            ("local_sgd", {"outer": "none", "sync_period": 4}),
            ("local_sgd", {"outer": "nesterov", "sync_period": 4, "fragments": 2}),
            ("wagma", {"tau": 3}),
        ]
    )
    assert labels == ["outer=none", "outer=nesterov", ""]
