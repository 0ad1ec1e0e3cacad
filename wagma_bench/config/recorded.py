"""A setting of a recorded configuration: the one place that reads a configuration as a mapping by its keys.

A run's ``run_start`` event (and its checkpoints' manifest) keeps the configuration it ran with as a plain
mapping; readers of past runs (reports, calibration, MLPerf logs, W&B links) take settings from it here, by
their dotted path, so that a key renamed in the schema is translated in this one module, and no module outside
``config/`` indexes a configuration by string keys (tests/test_config_once.py walks the code for it). A live
run reads its typed :class:`~wagma_bench.config.schema.RunConfig` instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wagma_bench.config.renamed import renamed_config


def recorded_config(config: Mapping | None) -> dict:
    """A recorded configuration as today's keys name it (a key renamed since it was recorded reads under its
    current name: :mod:`wagma_bench.config.renamed`); ``{}`` for none."""
    return renamed_config(config) or {}


def setting(config: Mapping | None, path: str, default: Any = None) -> Any:
    """``config``'s value at the dotted ``path`` (``"logger.wandb"``), or ``default`` where a section or the
    key is missing or null (a run recorded before the setting existed)."""
    node: Any = recorded_config(config)
    for key in path.split("."):
        if not isinstance(node, Mapping) or node.get(key) is None:
            return default
        node = node[key]
    return node
