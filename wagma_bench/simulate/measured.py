"""Measured model inputs: one JSON file that ``simulate --measured FILE`` reads.

Written by ``reproduce/scaling/measure_inputs.py`` (AD-PSGD's exchange cost measured in the suite's own runs
on this machine) and by ``make gpu-check`` (``reproduce/gpu/check.py``: the same on a GPU, with the per-rank
compute spread and the intra-node link). Each section is optional; ``measured_on`` says where the numbers come
from (``cpu`` or ``gpu``) and ``skipped`` lists what the writer could not measure there, so a CPU-measured
file is never taken for a GPU's::

    {"format": "wagma-bench measured inputs 1", "measured_on": "cpu", "source": "...", "skipped": [...],
     "gossip_cost": {"value": 0.06, "interval": [0.03, 0.09], "replicates": [...]},
     "network": {"intra": {"alpha_s": 2e-05, "bandwidth_GBps": 40.0}},
     "compute": {"sigma_rank": 0.01, "sigma": 0.03, "rho": 0.2}}

What is given on simulate's command line (``gossip_cost=``, ``sigma=`` ...) wins over the file.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wagma_bench.config import readback
from wagma_bench.simulate.costs import Network, parse_link
from wagma_bench.simulate.des import Workload
from wagma_bench.simulate.request import BOUNDS

FORMAT = "wagma-bench measured inputs 1"
PLACES = ("cpu", "gpu")


@dataclass
class Measured:
    path: str
    measured_on: str
    source: str = ""
    skipped: list[str] = field(default_factory=list)
    gossip_cost: float | None = None
    gossip_unmeasured: str | None = (
        None  # why the file's c is not a measurement (outside [0, 1] before holding)
    )
    gossip_replicates: list[float] = field(default_factory=list)
    intra: Any = None  # a costs.Link
    compute: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """One line for the output: what was read and where it was measured."""
        got = [
            f"gossip_cost {self.gossip_cost:.3g}" if self.gossip_cost is not None else None,
            f"gossip_cost unmeasured ({self.gossip_unmeasured}; the default c is used)"
            if self.gossip_unmeasured
            else None,
            "intra-node link" if self.intra is not None else None,
            "compute spread" if self.compute else None,
        ]
        said = ", ".join(g for g in got if g) or "nothing"
        return f"measured inputs from {self.path} ({self.measured_on.upper()}-measured): {said}"


def read_measured(path: str | Path) -> Measured:
    """Read and check a measured-inputs file; a ``ValueError`` naming the file and the key otherwise."""
    where = str(path)
    try:
        raw = readback.load(path, readback.MEASURED)  # every section of its type, else one line
    except readback.ReadBackError as err:
        raise readback.ReadBackError(f"--measured {err}") from None
    except OSError as err:
        raise ValueError(f"--measured {where}: cannot be read ({err.strerror or err})") from None
    if raw["format"] != FORMAT:
        raise ValueError(
            f"--measured {where}: format must be {FORMAT!r} (reproduce/scaling/measure_inputs.py or "
            "make gpu-check writes one)"
        )
    if raw.get("measured_on") not in PLACES:
        raise ValueError(
            f"--measured {where}: measured_on={raw.get('measured_on')!r}; it must be one of {PLACES}"
        )
    m = Measured(where, raw["measured_on"], str(raw.get("source") or ""), list(raw.get("skipped") or []))
    gossip = raw.get("gossip_cost")
    if isinstance(gossip, dict) and gossip.get("value") is None and gossip.get("unmeasured"):
        m.gossip_unmeasured = str(gossip["unmeasured"])  # said as such, never read as a measured 0
    elif gossip is not None:
        m.gossip_cost = _number(gossip.get("value"), "gossip_cost.value", where)
        m.gossip_replicates = [
            _number(v, "gossip_cost.replicates", where) for v in gossip.get("replicates", [])
        ]
    intra = (raw.get("network") or {}).get("intra")
    if intra is not None:
        m.intra = parse_link(intra, f"--measured {where}: network.intra")
    for key, value in (raw.get("compute") or {}).items():
        if key not in ("sigma_rank", "sigma", "rho"):
            raise ValueError(f"--measured {where}: compute.{key} is not a key; valid: sigma_rank, sigma, rho")
        m.compute[key] = _number(value, f"compute.{key}", where)
    return m


def _number(value: Any, key: str, where: str) -> float:
    name = key.split(".")[-1] if key.startswith("compute.") else key.split(".")[0]
    low, high, allowed = BOUNDS.get(name, (-math.inf, math.inf, "a number"))
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and low <= v <= high):
        raise ValueError(f"--measured {where}: {key}={value!r} is not allowed; it must be {allowed}")
    return v


def with_measured(
    workload: Workload, network: Network, m: Measured, given: set[str]
) -> tuple[Workload, Network]:
    """The workload and network with the file's numbers, except those given on
    the command line (``given``)."""
    changes: dict[str, Any] = {}
    if m.gossip_cost is not None and "gossip_cost" not in given:
        changes["gossip_cost"] = m.gossip_cost
    if workload.compute == "persistent":
        changes.update({k: v for k, v in m.compute.items() if k not in given})
    if changes:
        workload = dataclasses.replace(workload, **changes, source=f"{workload.source}; {m.line()}")
    if m.intra is not None:
        network = dataclasses.replace(network, intra=m.intra, _cache={})
    return workload, network
