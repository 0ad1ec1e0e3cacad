"""The error types every layer raises; a leaf module (imports nothing of wagma_bench), so that the configuration
check, the workloads and the launcher can all raise the same error without importing one another."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run: the message names the key, the bad value and what is allowed.

    Raised in the launching process, before any rank starts (``wagma_bench.config.schema.validate``, a workload's
    ``check``, the launcher's device plan); the CLI reports it and exits with code 2."""
