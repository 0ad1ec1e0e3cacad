"""The command line of ``wagma-bench run``, checked before anything is created.

Hydra parses and composes the overrides only inside ``hydra.main``, after the run directory has been locked
(and so created), and reports a misspelt key (``optimizer.gruop_size=2``) as a struct error without the keys
that exist. :func:`precheck` parses and composes the same command line first, with Hydra's own parser and
compose API: a parse error or an unknown key is a :class:`ConfigError` (exit 2, nothing created) that lists
the valid keys of the section; and the run directory the command line names is read as Hydra reads it
(``hydra.run.dir="/a dir/x"``: quotes removed, interpolations resolved), not as the raw text after ``=``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from wagma_bench.config.paths import conf_context
from wagma_bench.errors import ConfigError

# Hydra's own flags (``--cfg job``, ``-cd DIR``, ``--info``, ...): the command line is left to Hydra alone.
MULTIRUN_FLAGS = ("-m", "--multirun")


def precheck(overrides: list[str], conf_dir: Path) -> Path | None:
    """Parse and compose ``overrides``; raise :class:`ConfigError` for a parse
    error, an unknown key or option.

    Returns the run directory the command line names (``hydra.run.dir``, resolved), None where it names
    none, under ``-m`` (each job has its own) and where another composition error is left to Hydra's own
    report. An unknown option of a group (``optimizer=walgma``) is a ConfigError naming the group's
    options."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if any(o.startswith("-") and o not in MULTIRUN_FLAGS for o in overrides):
        return None
    multirun = any(o in MULTIRUN_FLAGS for o in overrides)
    args = [o for o in overrides if o not in MULTIRUN_FLAGS]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except OverrideParseException as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise ConfigError(f"{lines[0]}: {'; '.join(lines[1:])}") from None
    refuse_path_options(args, conf_dir)
    cfg = None
    for variant in _variants(parsed, multirun):
        cfg = _compose_checked(variant, conf_dir)
    if multirun or cfg is None or not any(o.key_or_group == "hydra.run.dir" for o in parsed):
        return None
    from omegaconf.errors import OmegaConfBaseException

    try:
        return Path(str(cfg.hydra.run.dir))
    except OmegaConfBaseException:  # an interpolation only a running job resolves (hydra.job.*): locked later
        return None


def _variants(parsed: list, multirun: bool) -> list[list[str]]:
    """Command lines to compose: the overrides as given; under ``-m`` one per value of each swept key (the
    other sweeps at their first value), so that a misspelt key that only one option lacks is found."""
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if not multirun or not sweeps:
        return [[o.input_line for o in parsed]]
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    try:
        values = {id(o): list(o.sweep_string_iterator()) for o in sweeps}
    except Exception:  # noqa: BLE001 (a glob sweep is expanded against the config groups: Hydra's launcher does that)
        return []
    first = [f"{o.get_key_element()}={values[id(o)][0]}" for o in sweeps]
    out = []
    for i, o in enumerate(sweeps):
        for v in values[id(o)]:
            out.append(fixed + first[:i] + [f"{o.get_key_element()}={v}"] + first[i + 1 :])
    return out


def _compose(overrides: list[str], conf_dir: Path) -> Any:
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # within a caller's conf_context (simulate)
        return compose(config_name="wagma", overrides=overrides, return_hydra_config=True)
    with conf_context(conf_dir=conf_dir):
        return compose(config_name="wagma", overrides=overrides, return_hydra_config=True)


def _compose_checked(overrides: list[str], conf_dir: Path) -> Any:
    """The composed config; an unknown key raises ConfigError with the valid keys of its section, an unknown
    option of a group with the group's options; any other composition error returns None (Hydra reports it its
    own way when the job starts)."""
    from hydra.errors import ConfigCompositionException

    try:
        return _compose(overrides, conf_dir)
    except ConfigCompositionException as err:
        message = unknown_option_message(err) or unknown_key_message(err, overrides, conf_dir)
        if message is None:
            return None
        raise ConfigError(message) from None


def refuse_path_options(overrides: list[str], conf_dir: Path) -> None:
    """Raise :class:`ConfigError` for a group option that is a path (``optimizer=../../etc/passwd``), quoting
    the override as typed with the group's options.

    An option is the name of a file in the group's folder, but Hydra joins the value onto the folder:
    ``./wagma`` ran WAGMA-SGD, ``../wagma`` composed the main config as an optimizer (Hydra's own report, exit
    1) and a missing ``../../etc/passwd`` came back as the group ``optimizer/../../etc``, which read
    ``optimizer.......etc=passwd``. No option here holds a ``/`` or ``..``. Asks Hydra for the groups (within
    a caller's ``conf_context``, else its own); an override that does not parse is left to the caller's
    parser."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if o not in MULTIRUN_FLAGS])
    except OverrideParseException:
        return
    suspects = [(o, v) for o in parsed for v in _string_values(o) if "/" in v or ".." in v]
    if not suspects:
        return

    def refuse() -> None:
        loader = GlobalHydra.instance().config_loader()
        for o, value in suspects:
            options = loader.get_group_options(o.key_or_group)
            if options:  # a group (``data.root=/x`` is a value, not an option)
                typed = o.input_line if not o.is_sweep_override() else f"{o.key_or_group}={value}"
                raise ConfigError(
                    f"{typed}: no such option of {o.key_or_group.replace('/', '.')}; choose one of: "
                    f"{', '.join(options)} (an option is a name, not a path)"
                )

    if GlobalHydra.instance().is_initialized():  # within a caller's conf_context (simulate, tune)
        refuse()
        return
    with conf_context(conf_dir=conf_dir):
        refuse()


def _string_values(override: Any) -> list[str]:
    """The values an override gives its key, as text (each of a sweep's; none for a delete or a glob)."""
    if override.is_sweep_override():
        try:
            return [str(v) for v in override.sweep_string_iterator()]
        except Exception:  # noqa: BLE001 (a glob is expanded against the config groups: no path in it)
            return []
    value = override.value()
    return [value] if isinstance(value, str) else []


def unknown_option_message(err: BaseException) -> str | None:
    """For Hydra's missing config of a group (``optimizer=walgma``): one line with the group's options, as a
    value refused elsewhere reads (Hydra's own report spans lines and exits 1; a renamed option was read under
    its new name before: config/renamed.py). None for any other error."""
    group, _, name = str(getattr(err, "missing_cfg_file", None) or "").rpartition("/")
    options = getattr(err, "options", None)
    if not group or not options:
        return None
    key = group.replace("/", ".")
    return f"{key}={name}: no such option of {key}; choose one of: {', '.join(options)}"


def unknown_key_message(err: BaseException, overrides: list[str], conf_dir: Path) -> str | None:
    """For a composition error that is a misspelt key (Hydra's struct error): the message with the valid keys
    of its section (what `run` prints; `simulate` prints the same); None for any other error."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = err.__cause__
    key = (
        getattr(cause, "full_key", None)
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError))
        else None
    )
    return _unknown_key(str(key), overrides, conf_dir) if key else None


def _unknown_key(key: str, overrides: list[str], conf_dir: Path) -> str:
    """``optimizer.gruop_size: unknown key (optimizer=allreduce); valid keys of optimizer: name, bucket_mb``:
    the valid keys are those of the same command line composed without the overrides of that key."""
    from omegaconf import OmegaConf

    def of_key(o: str) -> bool:
        name = o.split("=", 1)[0].lstrip("+~")
        return name == key or name.startswith(key + ".")

    given = [o for o in overrides if of_key(o)]
    parent = key.rpartition(".")[0]
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = _compose([o for o in overrides if not of_key(o)], conf_dir)
    except (HydraException, OmegaConfBaseException):
        return f"{key}: unknown key ({', '.join(given)})"
    node = OmegaConf.select(cfg, parent) if parent else cfg
    keys = [k for k in (node.keys() if OmegaConf.is_dict(node) else []) if parent or k != "hydra"]
    option = OmegaConf.select(cfg, f"{parent}.name") if parent else None
    chosen = (
        f"{parent}={option}; "
        if isinstance(option, str) and parent in ("optimizer", "workload", "imbalance", "data", "env")
        else ""
    )
    return (
        f"{key}: unknown key ({chosen}given as {', '.join(given)}); valid keys of {parent or 'the config'}: "
        f"{', '.join(map(str, keys))}"
    )


def quoted(value: str) -> str:
    """``value`` as a quoted Hydra override value, so that spaces, quotes, commas or brackets in a path
    (``hydra.run.dir=...`` passed on to a re-executed command) reach Hydra as they are."""
    body = value.replace("'", "\\'")  # Hydra unescapes only backslashes before a quote ...
    trailing = len(body) - len(body.rstrip("\\"))
    return "'" + body + "\\" * trailing + "'"  # ... the closing one included


class CommandParser(argparse.ArgumentParser):
    """argparse for the commands that take Hydra overrides beside their own flags (``sweep``, ``tune``): a bad
    flag or a missing value is a :class:`ConfigError` (one line, exit 2, as every refused value), not
    argparse's own exit. Overrides never start with ``-``, so they are the positional arguments."""

    def __init__(self, prog: str, usage: str):
        super().__init__(prog=prog, usage=usage, add_help=False, allow_abbrev=False)

    def parse_args(self, args=None, namespace=None):
        # overrides anywhere among the flags (`--out DIR gpus=8`), as `run` takes Hydra's
        return self.parse_intermixed_args(args, namespace)

    def error(self, message: str):
        first = self.usage.strip().splitlines()[0].strip().rstrip(" \\")
        raise ConfigError(f"{message}; usage: {first} ...")
