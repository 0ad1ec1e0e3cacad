"""The configuration is checked once per run and carried typed: the command validates it, a local run's
ranks get the checked RunConfig, and nothing outside config/ subscripts the composed dictionary by a section's
name (record/rundir.py's identity rules read it as data, by .get)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.cli_util import QUICK, run

ROOT = Path(__file__).resolve().parents[1]

# Installed in every Python process of the run (the command, the rank server, the store, each rank) through
# sitecustomize: each call of schema.validate appends its process id to a file.
COUNTING_HOOK = """
import functools, os
import wagma_bench.config.schema as schema

with open(os.environ["WAGMA_TEST_VALIDATE_LOG"] + ".loaded", "a") as f:  # the hook is in this process
    f.write(f"{os.getpid()}\\n")

_validate = schema.validate

@functools.wraps(_validate)
def counting_validate(*args, **kwargs):
    with open(os.environ["WAGMA_TEST_VALIDATE_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return _validate(*args, **kwargs)

schema.validate = counting_validate
"""


def test_a_local_run_validates_its_configuration_once_in_all_its_processes(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTING_HOOK)
    log = tmp_path / "validate.log"
    env = {**os.environ, "WAGMA_TEST_VALIDATE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    # two rounds and one evaluation: every process that could validate still starts and runs its part
    out = run([*QUICK[:1], "train.max_steps=2", "eval.every_steps=2", *QUICK[3:], f"hydra.run.dir={tmp_path / 'run'}"],
              env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    loaded = set(log.with_name(log.name + ".loaded").read_text().split())
    assert len(loaded) >= 3, loaded  # the command and its two ranks at least (a hook that failed to load counts 0)
    calls = log.read_text().split()
    assert calls == [calls[0]], f"schema.validate called {len(calls)} times, in processes {calls}"


def test_the_composed_dictionary_is_read_by_key_only_inside_config():
    """``raw_cfg["launcher"][...]``-style reads outside config/: the typed RunConfig has every value."""
    pattern = re.compile(r"raw_cfg\b|\.raw\[|\braw\[\s*[\"'](launcher|comm|train|eval|optimizer|workload|data|"
                         r"imbalance|checkpoint|logger)[\"']")
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in sorted((ROOT / "wagma_bench").rglob("*.py")) if "config" not in path.parts
                 for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
