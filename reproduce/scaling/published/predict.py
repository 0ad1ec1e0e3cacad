"""Published scale measurements against `wagma-bench simulate`: each row of ``inputs.yaml`` (a paper's or
project's figure, its hardware and network) predicted from the stated hardware's vendor figures, with the
error. Writes the table into this folder's README.md and docs/simulator.md between their
``<!-- published:begin -->`` / ``<!-- published:end -->`` markers (``--write``), or prints it.

    .venv/bin/python reproduce/scaling/published/predict.py [--write]

tests/test_published_scale.py recomputes the table from the committed inputs and compares it with both pages.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import SimConfig, Workload, simulate
from wagma_bench.simulate.presets import preset
from wagma_bench.simulate.run_spread import with_measured_spread

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
INPUTS = HERE / "inputs.yaml"
PAGES = (HERE / "README.md", ROOT / "docs" / "simulator.md")
ROW_KEYS = {
    "id", "source", "hardware", "network", "model", "batch", "measured", "published", "numerator",
    "denominator", "per_gpu",
}  # fmt: skip
OPTIONAL = {"gpu", "gpus_per_agent", "compute_from"}
TOP_KEYS = {"utilization", "sigma", "rounds", "gpus", "models", "networks", "rows"}


def load(path: Path = INPUTS) -> dict:
    """The inputs, checked: every row names a known network, model and GPU, and has every field."""
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict) or set(spec) != TOP_KEYS:
        raise ValueError(f"{path}: top-level keys must be {sorted(TOP_KEYS)}")
    for row in spec["rows"]:
        where = f"{path}: row {row.get('id', '?')}"
        missing, stray = ROW_KEYS - set(row), set(row) - ROW_KEYS - OPTIONAL
        if missing or stray:
            raise ValueError(f"{where}: missing {sorted(missing)}, unknown {sorted(stray)}")
        if row["network"] not in spec["networks"]:
            raise ValueError(f"{where}: network {row['network']!r} is not in networks")
        if row["model"] != "rl" and (
            row["model"] not in spec["models"] or row.get("gpu") not in spec["gpus"]
        ):
            raise ValueError(f"{where}: model {row['model']!r} or gpu {row.get('gpu')!r} is not defined")
        if not float(row["published"]) > 0:
            raise ValueError(f"{where}: published must be a number > 0")
    return spec


def workload(spec: dict, row: dict) -> Workload:
    """One rank's step from the vendor's peak and the model's multiply-adds (or the RL preset)."""
    if row["model"] == "rl":
        return with_measured_spread(preset("rl"), [str(ROOT / row["compute_from"])])
    model, gpu = spec["models"][row["model"]], spec["gpus"][row["gpu"]]
    gpus = int(row.get("gpus_per_agent", 1))
    flop_per_sample = 6.0 * model["gmacs"] * 1e9  # forward 2 FLOP per MAC, backward twice the forward
    step_s = row["batch"] * flop_per_sample / (gpus * gpu["tflops"] * 1e12 * spec["utilization"])
    return Workload(
        name=row["model"],
        step_s=step_s,
        batch=row["batch"],
        params=model["params"],
        compute="lognormal",
        sigma=spec["sigma"],
        backward_fraction=2 / 3,
    )


def network(spec: dict, name: str) -> Network:
    net = spec["networks"][name]
    return Network.from_profile(net, net["gpus_per_node"], f"networks.{name}")


def throughput(spec: dict, row: dict, side: dict, wl: Workload) -> float:
    cfg = SimConfig(
        side["optimizer"],
        side["gpus"],
        wl,
        network(spec, row["network"]),
        steps=spec["rounds"],
        control_every=0,
    )
    return simulate(cfg).throughput


def predict(spec: dict, row: dict) -> float:
    wl = workload(spec, row)
    num, den = row["numerator"], row["denominator"]
    ratio = throughput(spec, row, num, wl) / throughput(spec, row, den, wl)
    return ratio * den["gpus"] / num["gpus"] if row["per_gpu"] else ratio


def _figure(x: float) -> str:
    return f"{x:.0f}" if x >= 20 else f"{x:.2f}"


def table(spec: dict, predicted: dict[str, float]) -> str:
    lines = [
        (
            "| row | source | hardware, network | model, batch per rank | measured | published | predicted "
            "| error |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in spec["rows"]:
        pub, pred = float(row["published"]), predicted[row["id"]]
        lines.append(
            f"| `{row['id']}` | {row['source']} | {row['hardware']}; `{row['network']}` | {row['model']}, "
            f"{row['batch']} | {row['measured']} | {_figure(pub)} | {_figure(pred)} "
            f"| {(pred - pub) / pub:+.0%} |"
        )
    within = sum(abs(predicted[r["id"]] / float(r["published"]) - 1) <= 0.15 for r in spec["rows"])
    lines.append("")
    lines.append(f"{within} of {len(spec['rows'])} rows within 15% of the published figure.")
    return "\n".join(lines)


def predictions(spec: dict) -> dict[str, float]:
    return {row["id"]: predict(spec, row) for row in spec["rows"]}


def replace_block(text: str, block: str, name: str = "published") -> str:
    pattern = re.compile(rf"(<!-- {name}:begin -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"no <!-- {name}:begin --> ... <!-- {name}:end --> block")
    return pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--write", action="store_true", help="write the table into README.md and docs/simulator.md"
    )
    args = ap.parse_args(argv)
    spec = load()
    text = table(spec, predictions(spec))
    print(text)
    if args.write:
        for page in PAGES:
            new = replace_block(page.read_text(), text)
            tmp = page.with_suffix(".tmp")
            tmp.write_text(new)
            tmp.replace(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
