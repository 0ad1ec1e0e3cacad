"""Every `wagma-bench` command the README and docs/ show still parses: a renamed key, preset or flag fails
here.

The examples are read from the pages themselves (fenced code blocks and inline code spans), so a new example
is checked without being listed. Each is checked the way its command would check it before doing anything:
`run`'s overrides by `run`'s own pre-check (Hydra composes every variant, the schema validates it), a sweep's
by composing and validating every run of it, a tuning's every trial, a simulation's through `simulate --cfg
job`; the flags of every command (and `report`, `claims`, `comm-bench`, which take only paths and flags)
against its `--help`. Placeholders (`...`, `<date>`, an optional `[...]` group, `a | b` alternatives) are left
out."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from wagma_bench.cli import main as cli_main
from wagma_bench.config.paths import CONF_DIR

pytestmark = pytest.mark.background  # composes, times nothing: beside the serial tests at idle priority
ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "slurm" / "README.md",
    *sorted((ROOT / "reproduce").glob("*/README.md")),
]
COMMANDS = ("run", "sweep", "tune", "simulate", "report", "claims", "comm-bench", "wandb-import")
# a command's own words after its name (not overrides): `sweep submit DIR`, `tune score DIR`
SUBCOMMANDS = {"sweep": {"submit", "status", "wait", "cancel"}, "tune": {"score"}}
_FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
_INLINE = re.compile(r"(?<!`)`(wagma-bench [^`]+)`(?!`)")


def _optional_groups_removed(line: str) -> str:
    """`[a | b]` usage groups out, outside quotes (a quoted Hydra list `'x=[a,b]'` stays)."""
    out, depth, quote = [], 0, None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"" and depth == 0:
            quote = ch
        elif ch == "[" and (depth or i == 0 or line[i - 1] == " "):
            depth += 1
            continue
        elif ch == "]" and depth:
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)


def command_lines(text: str) -> list[str]:
    """Each `wagma-bench ...` command of a page, its continuation lines joined, from the word `wagma-bench`
    on."""
    lines = []
    blocks = [re.sub(r"\\\n\s*", " ", b) for b in _FENCE.findall(text)]
    candidates = [line for b in blocks for line in b.splitlines()] + _INLINE.findall(text)
    for line in candidates:
        for part in re.split(r";|&&|\s/\s", line):  # `a; b`, and README's `srun ... / mpiexec ...`
            found = re.search(r"(?:^|[\s/])wagma-bench\s+(\S.*)", part)
            if found and not part.lstrip().startswith("#"):
                lines.append("wagma-bench " + found.group(1))
    return lines


def argv_of(line: str) -> list[str]:
    words = shlex.split(_optional_groups_removed(line), comments=True)[1:]
    placeholder = re.compile(r"\.\.\.|<[^>]*>|^\|$")
    return [w for w in words if not placeholder.search(w)]


def examples() -> list[tuple[str, list[str]]]:
    seen, out = set(), []
    for page in PAGES:
        for line in command_lines(page.read_text()):
            argv = argv_of(line)
            key = tuple(argv)
            if (
                len(argv) > 1 and argv[0] in COMMANDS and key not in seen
            ):  # `wagma-bench sweep` alone names it
                seen.add(key)
                out.append((page.relative_to(ROOT).as_posix(), argv))
    return out


def _cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli_main(argv)
        except SystemExit as err:  # argparse's --help
            code = err.code or 0
    return code, out.getvalue()


VALUED = {
    "--out",
    "--interval",
    "--timeout",
    "--readme",
    "--cfg",
}  # the flags of these commands that take a value
_HELP: dict[str, str] = {}


def help_text(command: str) -> str:
    if command not in _HELP:
        code, text = _cli([command, "--help"])
        assert code == 0, text
        _HELP[command] = text
    return _HELP[command]


def check(argv: list[str], tmp_path: Path) -> None:
    """Raises (AssertionError or the command's own ConfigError) when the example no longer parses."""
    from wagma_bench.campaign import smoke, sweep, tune
    from wagma_bench.config.overrides import precheck

    command, rest = argv[0], argv[1:]
    for flag in (w.split("=", 1)[0] for w in rest if w.startswith("--") and w != "--help"):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text(command)), (
            f"{command} has no flag {flag} (not in `wagma-bench {command} --help`)"
        )
    if rest and rest[0] in SUBCOMMANDS.get(command, ()):
        assert re.search(rf"\b{command} {rest[0]}\b", help_text(command)), f"no `{command} {rest[0]}`"
        return
    # the words that are not flags nor a flag's value: the overrides, and a misspelt subcommand
    words = [w for i, w in enumerate(rest) if not w.startswith("-") and not (i and rest[i - 1] in VALUED)]
    overrides = [w for w in words if "=" in w]
    if command == "run" and "--help" not in rest:
        precheck([*words, *(w for w in rest if w in ("-m", "--multirun"))], CONF_DIR)
    elif command == "sweep":
        spec = smoke.smoke_spec(words) if "--smoke" in rest else sweep.parse_spec(words)
        sweep.check_run_configs(spec, sweep.expand(spec))
    elif command == "tune":  # every combination and its search space; one trial of each (the rest alike)
        tune.make_plan(tune.parse_args([*words, "tune.trials=1", "tune.studies=1", "--out", str(tmp_path)]))
    elif command == "simulate" and not {"--calibrate", "--convergence", "--compute-from"} & set(rest):
        code, text = _cli(["simulate", *overrides, "--cfg", "job"])
        assert code == 0, text


EXAMPLES = examples()


def test_the_pages_show_an_example_of_every_command():
    assert {argv[0] for _, argv in EXAMPLES} == set(COMMANDS)


@pytest.mark.parametrize(
    "argv", [argv for _, argv in EXAMPLES], ids=[f"{page}:{' '.join(argv)[:60]}" for page, argv in EXAMPLES]
)
def test_every_documented_command_parses(argv, tmp_path):
    check(argv, tmp_path)


@pytest.mark.parametrize(
    "line, named",
    [
        ("wagma-bench run optimizer=local_sgd optimizer.perod=8", "perod"),
        (
            "wagma-bench run -m optimizer=allreduce,wagma experiment=paper_resnet50_stragler",
            "paper_resnet50_stragler",
        ),
        ("wagma-bench sweep cluster=local gpus=4 'optimizer=glob(*)' imbalance=papr --dry-run", "papr"),
        ("wagma-bench tune workload=resnet optimizer=wagma tune.trails=2 --out x", "trails"),
        ("wagma-bench simulate gpus=64 optimizer=wagma optimizer.tua=3", "tua"),
        ("wagma-bench comm-bench --nprocs 4", "--nprocs"),
        ("wagma-bench sweep stats sweeps/x", "stats"),
    ],
)
def test_a_renamed_key_preset_or_flag_fails_the_check_naming_it(line, named, tmp_path):
    """The check is not vacuous: an example with a misspelt key, preset, flag or subcommand is refused,
    named."""
    with pytest.raises(Exception) as err:
        check(argv_of(line), tmp_path)
    assert named in str(err.value)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_commands_help_is_terminal_text(command):
    """`--help` prints a module's docstring: without reStructuredText's roles and double backquotes
    (simulate's printed `:func:` markup)."""
    text = help_text(command)
    assert not re.search(r":(func|class|mod|meth|attr):`|``", text), text
