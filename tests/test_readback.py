"""Every file the suite reads back goes through :mod:`wagma_bench.config.readback` (issue 79).

Two checks, each failing when one reader bypasses the module:

- every registered schema has a row in :data:`READERS` (its real entry point and a valid file), and each entry
  point, fed the file cut in half, emptied, of the wrong shape, and with each section wrongly typed in turn,
  answers with a one-line :class:`ReadBackError` naming the file (or, for the readers that tolerate a torn
  file by design, with their "nothing there"); a reader that parses on its own raises a JSONDecodeError,
  TypeError or AttributeError instead;
- an AST walk of the package finds every ``json.load``/``json.loads``/``yaml.safe_load``/``yaml.load`` call
  and allows it only in readback.py or in :data:`NOT_FILES` (each says why the text is not a read-back file).
"""

from __future__ import annotations

import ast
import json
import lzma
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import wagma_bench
from wagma_bench.config import readback
from wagma_bench.config.readback import ReadBackError
from wagma_bench.record.loggers import IMPORTED

PACKAGE = Path(wagma_bench.__file__).parent


def _claim():
    from wagma_bench.analysis.claims import load_claims

    return next(c for c in load_claims() if c.predicted is not None)


def _claims(path: Path):
    from wagma_bench.analysis.claims import load_claims

    return load_claims(path)


def _predictions(path: Path):
    from wagma_bench.analysis.claims import predict

    return predict(_claim(), path.parent)


def _intervals(path: Path):
    from wagma_bench.analysis.claims import prediction_uncertainty

    return prediction_uncertainty(_claim(), path.parent, 16, "throughput")


def _interval_resume(path: Path):
    from wagma_bench.simulate.resume import load

    return load(path, "c")


def _manifest(path: Path):
    from wagma_bench.campaign.sweep_jobs import load_manifest

    return load_manifest(path.parent)


def _tune_plan(path: Path):
    from wagma_bench.analysis.tuning import load_trials

    return load_trials(path.parent)


def _wandb_spec(path: Path):
    from wagma_bench.analysis.wandb_panels import publish

    return publish(path)


def _measured(path: Path):
    from wagma_bench.simulate.measured import read_measured

    return read_measured(path)


def _checked(path: Path):
    from wagma_bench.runtime.handover import CHECKED_ENV, handed

    return handed(path.parent, env={CHECKED_ENV: str(path)})


def _where(path: Path):
    from wagma_bench.record.checkpoint import recorded_folder

    return recorded_folder(path.parent)


def _checkpoint_manifest(path: Path):
    from wagma_bench.record.checkpoint import _latest_in

    (path.parent.parent / "latest").write_text(path.parent.name + "\n")
    return _latest_in(path.parent.parent)


def _summary(path: Path):
    from wagma_bench.record.events import RunEvents

    return RunEvents.read(path.parent).saved_summary


def _note(path: Path):
    from wagma_bench.record.rundir import cancel_note

    return cancel_note(path.parent)


def _wandb_note(path: Path):
    from wagma_bench.analysis.run_records import wandb_import_note

    return wandb_import_note(path.parent.parent)


def _smoke(path: Path):
    from wagma_bench.campaign.smoke import _smoke_of

    return _smoke_of(path)


def _steps(path: Path):
    from wagma_bench.record.steps import read_step_records

    path.write_bytes(lzma.compress(path.read_bytes()))
    return read_step_records(path.parent)


@dataclass
class Reader:
    file: str  # where the entry point looks, under a fresh folder
    valid: object  # a file of its kind, as its writer writes it
    call: Callable[[Path], object]
    tolerant: bool = False  # None for a damaged file, by design (a torn write is "not there yet")


RUN = {"name": "r0", "gpus": 2, "overrides": ["seed=1"], "run_dir": "runs/r0", "job": 0, "array_index": 0}
TRIAL = {"name": "t", "combo": "c", "study": 1, "trial": 1, "seed": 1, "params": {}, "overrides": []}
READERS = {
    "sweep manifest": Reader(
        "manifest.json",
        {
            "version": 1,
            "jobs": [{"script": "j.sbatch", "gpus": 2, "array": True, "job_id": None}],
            "runs": [RUN],
        },
        _manifest,
    ),
    "tuning plan (tune.json)": Reader(
        "tune.json", {"version": 1, "studies": 1, "trials_per_study": 1, "trials": [TRIAL]}, _tune_plan
    ),
    "claims file": Reader("claims.yaml", {"claims": []}, _claims),
    "simulator prediction table (predictions.json)": Reader(
        "predictions.json", [{"optimizer": "wagma", "world_size": 16, "throughput": 1.0}], _predictions
    ),
    "simulator interval file (interval.json)": Reader(
        "interval.json", {"predictions": [], "sensitivity": []}, _intervals
    ),
    "simulate --interval's resume file": Reader(
        ".sim.interval-resume.json",
        {"format": "wagma-bench interval resume 1", "command": "c", "simulations": []},
        _interval_resume,
    ),
    "W&B report spec": Reader("w.json", {"version": 1, "report": {}, "workspace": {}}, _wandb_spec),
    "measured-inputs file": Reader(
        "m.json", {"format": "wagma-bench measured inputs 1", "measured_on": "cpu", "skipped": []}, _measured
    ),
    "checked configuration (checked_config.json)": Reader(
        "checked_config.json", {"launch": "x", "run_dir": "/nowhere", "config": {}}, _checked
    ),
    "checkpoint folder record (checkpoint.json)": Reader("checkpoint.json", {"dir": "/nowhere"}, _where),
    "checkpoint manifest": Reader(
        "round-4/manifest.json",
        {"round": 4, "world_size": 2, "resume_hash": "h", "files": {}},
        _checkpoint_manifest,
    ),
    "run summary (summary.json)": Reader("summary.json", {"status": "completed"}, _summary, tolerant=True),
    "run directory note (.lock, cancelled.json)": Reader("cancelled.json", {"by": "x"}, _note, tolerant=True),
    "step table (steps.json.xz)": Reader("steps.json.xz", {"0": {}}, _steps),
    "W&B import note": Reader("wandb/" + IMPORTED, {"project": "p"}, _wandb_note, tolerant=True),
    "smoke sweep's manifest": Reader("manifest.json", {"smoke": {}}, _smoke, tolerant=True),
}


def test_every_schema_has_a_reader_in_the_table():
    assert set(readback.SCHEMAS) == set(READERS)


def _wrong(spec) -> object:
    """A value of another kind than ``spec`` allows."""
    return next(v for v in ("x", 7, [1], {"a": 1}, True) if not readback._shape_fits(v, spec))


def damaged(name: str) -> dict[str, str]:
    """The valid file cut in half, emptied, of the other shape, and with each section wrongly typed."""
    schema, valid = readback.SCHEMAS[name], READERS[name].valid
    dump = (lambda v: __import__("yaml").safe_dump(v)) if schema.fmt == "yaml" else json.dumps
    text = dump(valid)
    out = {
        "empty": "",
        "cut": text[: len(text) // 2],
        "shape": dump({"a": 1} if isinstance(valid, list) else [1]),
    }
    spec = schema.spec[0] if isinstance(schema.spec, list) else schema.spec
    for key, sub in spec.items() if isinstance(spec, dict) else ():
        name_ = key.key if isinstance(key, readback.optional) else key
        if sub is readback.ANY:
            continue
        bad = {**(valid[0] if isinstance(valid, list) else valid), name_: _wrong(sub)}
        out[f"{name_} wrongly typed"] = dump([bad] if isinstance(valid, list) else bad)
    return out


CASES = [(name, case) for name in READERS for case in damaged(name)]


@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}: {c}" for n, c in CASES])
def test_every_reader_refuses_a_damaged_file_in_one_line(tmp_path, monkeypatch, name, case):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    reader = READERS[name]
    path = tmp_path / reader.file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(damaged(name)[case])
    if reader.tolerant:
        assert reader.call(path) is None
        return
    with pytest.raises((ReadBackError, RuntimeError)) as err:  # a checkpoint's: CheckpointError, its words
        reader.call(path)
    said = str(err.value)
    assert "\n" not in said and reader.file.rpartition("/")[2] in said and readback.SCHEMAS[name].name in said


def test_a_valid_file_passes_every_reader(tmp_path):
    for name, reader in READERS.items():
        path = tmp_path / name.replace(" ", "_") / reader.file
        path.parent.mkdir(parents=True)
        schema = readback.SCHEMAS[name]
        path.write_text(
            __import__("yaml").safe_dump(reader.valid) if schema.fmt == "yaml" else json.dumps(reader.valid)
        )
        readback.load(path, schema)  # the base of the damaged files is one of its kind


# where the text parsed is not a file read back: why
NOT_FILES = {
    ("config/readback.py", "parse"): "the one reader",
    (
        "record/files.py",
        "parse_jsonl",
    ): "JSONL logs (read_jsonl, a compacted event log): a torn last line skipped by design, a line a record",
    ("record/loggers.py", "_new_records"): "the lines of a JSONL log appended since the last read",
    ("runtime/handover.py", "receive"): "a message from torchrun's store, not a file",
    ("runtime/startup.py", "inherit"): "an environment variable set by our own launcher",
    ("config/search_space.py", "parse_space_override"): "a value on the command line",
    (
        "simulate/calibrate.py",
        "find_inputs",
    ): "probes a tree for comm-bench JSON; one given by name is refused",
}


def _parse_calls() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if "json" not in text and "yaml" not in text:  # neither module named: no call to either
            continue
        tree = ast.parse(text)
        rel = path.relative_to(PACKAGE).as_posix()
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and (node.func.value.id, node.func.attr)
                    in {("json", "load"), ("json", "loads"), ("yaml", "safe_load"), ("yaml", "load")}
                ):
                    found.append((rel, func.name, node.lineno))
    return found


def test_no_module_parses_a_read_back_file_on_its_own():
    calls = _parse_calls()
    assert ("config/readback.py", "parse") in {(r, f) for r, f, _ in calls}  # the walk sees calls
    bypass = [f"{r}:{line} in {f}()" for r, f, line in calls if (r, f) not in NOT_FILES]
    assert not bypass, f"parse read-back files with wagma_bench.config.readback: {bypass}"
