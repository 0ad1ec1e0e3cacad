"""Faults a demanding user or a hostile tester provokes (issue 15's table), each through the real CLI and
real local gloo ranks: bad values refused up front, one writer per run directory, consistent event logs
across restarts, checkpoints verified as sets."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from wagma_bench.config import FIXED_SECTIONS, RANGES, option_schemas
from wagma_bench.workloads import WORKLOADS

BIN = Path(sys.executable).parent / "wagma-bench"
QUICK = ["launcher.nproc=2", "train.max_steps=12", "eval.every_steps=6", "logger.progress=off"]


def run(args, timeout=300, **kw):
    return subprocess.run([str(BIN), "run", *args], capture_output=True, text=True, timeout=timeout,
                          check=False, **kw)


def no_rank_started(run_dir: Path) -> bool:
    return not (run_dir / "events.jsonl").exists() and not (run_dir / "steps").exists()


# --- rows 6, 7, 8: every bad value refused before any rank starts ------------------------------------

BAD_VALUES = [
    ("train.batch_size", "-4", []),
    ("train.batch_size", "0", []),
    ("launcher.nproc", "0", []),
    ("launcher.nproc", "-1", []),
    ("optimizer.group_size", "3", ["optimizer=wagma"]),
    ("optimizer.group_size", "8", ["optimizer=wagma"]),       # larger than 2 ranks padded to a power of two
    ("train.max_steps", "0", []),
    ("eval.every_steps", "0", []),
    ("imbalance.delay_s", "-1", ["imbalance=paper"]),
    ("train.momentum", "1.5", []),                            # a fraction
    ("workload.sync_frac", "-0.1", ["workload=ddppo"]),       # a probability
    ("workload.gamma", "1.01", ["workload=ddppo"]),
    ("optimizer.period", "0", ["optimizer=local_sgd"]),       # a schema's own __post_init__ check
]


@pytest.mark.parametrize("key,value,extra", BAD_VALUES, ids=[f"{k}={v}" for k, v, _ in BAD_VALUES])
def test_bad_value_is_refused_before_any_rank_starts(tmp_path, key, value, extra):
    out = run(extra + ["launcher.nproc=2", f"{key}={value}", f"hydra.run.dir={tmp_path}"], timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "wagma-bench run: error:" in out.stderr
    assert f"{key}={value}" in out.stderr, out.stderr[-2000:]
    assert "must be" in out.stderr  # ... and what is allowed
    assert no_rank_started(tmp_path)


def test_imagenet_class_folder_without_images_is_refused(tmp_path):
    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (root / split / cls).mkdir(parents=True)
            (root / split / cls / "a.JPEG").write_bytes(b"")  # never opened: the layout check runs first
    for f in (root / "train" / "dog").iterdir():
        f.unlink()
    run_dir = tmp_path / "run"
    out = run(["data=imagenet", f"data.root={root}", f"hydra.run.dir={run_dir}"], timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"class folder {root / 'train' / 'dog'} holds no images" in out.stderr
    assert no_rank_started(run_dir)


def _numeric_fields() -> list[str]:
    schemas = [(section, cls) for section, cls in FIXED_SECTIONS.items()]
    schemas += [(section, cls) for section, options in option_schemas().items() for cls in options.values()]
    schemas += [(getattr(w, "DATA_SECTION", "data"), cls) for w in WORKLOADS.values() for cls in w.DATA.values()]
    keys = []
    for section, cls in schemas:
        hints = typing.get_type_hints(cls)
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(cls)
                 if any(t in str(hints[f.name]) for t in ("int", "float")) and hints[f.name] is not bool]
    return sorted(set(keys))


def test_every_numeric_setting_has_an_allowed_range():
    missing = [key for key in _numeric_fields() if key not in RANGES]
    assert not missing, f"add these to wagma_bench.config.RANGES: {missing}"
