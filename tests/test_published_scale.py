"""The simulator held against published scale measurements (reproduce/scaling/published/): the table on its
page and in docs/simulator.md is the one its script computes from the committed inputs now."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli_util import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "reproduce" / "scaling" / "published" / "predict.py"


def _block(page: Path) -> str:
    found = re.search(r"<!-- published:begin -->\n(.*?)\n<!-- published:end -->", page.read_text(), re.DOTALL)
    assert found, f"{page.relative_to(ROOT)} has no <!-- published:begin --> ... <!-- published:end --> block"
    return found.group(1)


def test_published_table_is_the_scripts_table_of_the_committed_inputs():
    script = load_script(SCRIPT)
    spec = script.load()
    assert len(spec["rows"]) >= 6
    assert sum(r["numerator"]["optimizer"] in ("sgp", "dpsgd", "adpsgd") for r in spec["rows"]) >= 2
    text = script.table(spec, script.predictions(spec))
    for page in script.PAGES:
        assert _block(page) == text, (
            f"{page.relative_to(ROOT)} differs from `python {SCRIPT.relative_to(ROOT)}`: run it with --write"
        )


def test_an_input_row_without_its_published_figure_is_refused(tmp_path):
    script = load_script(SCRIPT)
    text = SCRIPT.with_name("inputs.yaml").read_text().replace("    published: 0.90\n", "", 1)
    bad = tmp_path / "inputs.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"row horovod-inception3-128: missing \['published'\]"):
        script.load(bad)
