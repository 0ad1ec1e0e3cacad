"""Every command ends through one function, :func:`wagma_bench.exits.run_body`: what a command's body raises
becomes the documented exit code and one line on stderr. Checked on the code (no command module of ``cli/``
ends the process itself, and each command's ``main`` returns the mapper's answer) and on the mapper's answers,
kind by kind."""

from __future__ import annotations

import ast
import errno
import signal
from pathlib import Path

import pytest

import wagma_bench.cli
from wagma_bench import exits
from wagma_bench.cli import COMMANDS
from wagma_bench.errors import ConfigError, SymlinkRefused

CLI = Path(wagma_bench.cli.__file__).parent


def _ends_the_process(node: ast.AST) -> str | None:
    """What ``node`` is, if it ends the process without the mapper: ``sys.exit(...)``, ``os._exit(...)``,
    ``exit()``/``quit()``, or ``raise SystemExit``; else None."""
    if isinstance(node, ast.Call):
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and (f.value.id, f.attr) in (("sys", "exit"), ("os", "_exit"))
        ):
            return f"{f.value.id}.{f.attr}()"
        if isinstance(f, ast.Name) and f.id in ("exit", "quit"):
            return f"{f.id}()"
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id == "SystemExit":
            return "raise SystemExit"
    if (
        isinstance(node, ast.ImportFrom)
        and node.module in ("sys", "os")
        and any(a.name in ("exit", "_exit") for a in node.names)
    ):
        return f"from {node.module} import exit"
    return None


def test_no_command_module_ends_the_process_itself():
    """A command that exits by itself bypasses the one mapper: its code and line would be its own."""
    found = [
        f"{path.name}:{node.lineno}: {what}"
        for path in sorted(CLI.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (what := _ends_the_process(node)) is not None
    ]
    assert not found, found


def test_the_check_finds_each_way_of_ending_the_process():
    """The check above, on code that ends the process each way it looks for (it would pass on nothing
    otherwise)."""
    code = (
        "import sys, os\nfrom sys import exit\nsys.exit(2)\nos._exit(1)\nexit(3)\nraise SystemExit(2)\n"
        "raise SystemExit\n"
    )
    found = [w for node in ast.walk(ast.parse(code)) if (w := _ends_the_process(node))]
    assert sorted(found) == sorted(
        ["sys.exit()", "os._exit()", "exit()", "raise SystemExit", "raise SystemExit", "from sys import exit"]
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_main_returns_the_mappers_answer_under_its_own_name(command):
    """``main`` of each command's module has one ``return``: ``exits.run_body("COMMAND", ...)``."""
    module = Path(COMMANDS[command].replace(".", "/") + ".py").name
    tree = ast.parse((CLI / module).read_text())
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    returns = [n for n in ast.walk(main) if isinstance(n, ast.Return)]
    assert len(returns) == 1, f"{module}: main returns in {len(returns)} places"
    call = returns[0].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "exits.run_body", ast.unparse(returns[0])
    assert isinstance(call.args[0], ast.Constant) and call.args[0].value == command, ast.unparse(call)


def _answer(capsys, body, **kwargs) -> tuple[int, list[str]]:
    code = exits.run_body("cmd", body, **kwargs)
    return code, capsys.readouterr().err.strip().splitlines()


def _raises(err: BaseException):
    def body() -> int:
        raise err

    return body


@pytest.mark.parametrize(
    "err,code,line",
    [
        (
            ConfigError("x=1 is not allowed; it must be 2"),
            exits.REFUSED,
            "wagma-bench cmd: error: x=1 is not allowed; it must be 2",
        ),
        (
            SymlinkRefused(errno.ELOOP, "out is a link"),
            exits.REFUSED,
            "wagma-bench cmd: error: out is a link",  # a refusal in words: no errno
        ),
        (
            OSError(errno.ENOSPC, "No space left on device"),
            exits.FAILED,
            "wagma-bench cmd: error: [Errno 28] No space left on device",
        ),
        (KeyboardInterrupt(), exits.INTERRUPTED, "wagma-bench cmd: interrupted"),
        (exits.Stopped(signal.SIGTERM), 143, "wagma-bench cmd: stopped by SIGTERM"),
        (exits.Stopped(signal.SIGHUP), 129, "wagma-bench cmd: stopped by SIGHUP"),
        (
            exits.Stop(exits.DIVERGED, "diverged: the loss became nan", error=True),
            exits.DIVERGED,
            "wagma-bench cmd: error: diverged: the loss became nan",
        ),
        (
            exits.Stop(
                exits.INTERRUPTED, "wagma-bench: interrupted at step 4, checkpoint saved", error=False
            ),
            exits.INTERRUPTED,
            "wagma-bench: interrupted at step 4, checkpoint saved",
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_each_kind_of_end_has_its_code_and_one_line(err, code, line, capsys):
    assert _answer(capsys, _raises(err)) == (code, [line])


def test_a_body_that_returns_is_answered_with_its_code_and_says_nothing(capsys):
    assert _answer(capsys, lambda: exits.OK) == (exits.OK, [])


def test_stop_and_end_raise_what_the_mapper_answers(capsys):
    """:func:`exits.stop` and :func:`exits.end` are how Hydra's task function ends a command (a SystemExit,
    which Hydra lets through where it would print any Exception's traceback)."""

    def refused() -> int:
        exits.stop("train.lr=nan is not allowed")

    def stopped() -> int:
        exits.end("wagma-bench: stopped by SIGTERM at step 3", 143)

    assert issubclass(exits.Stop, SystemExit) and not issubclass(exits.Stop, Exception)
    said = "wagma-bench cmd: error: train.lr=nan is not allowed"
    assert _answer(capsys, refused) == (exits.REFUSED, [said])
    assert _answer(capsys, stopped) == (143, ["wagma-bench: stopped by SIGTERM at step 3"])


def test_a_commands_own_kinds_and_words(capsys):
    """``also`` maps a command's own exceptions (an interruption's line has no ``error:``); ``interrupted``
    and ``stopped`` are a command's own words for Ctrl-C and a stop signal (None: no line)."""

    class Interrupted(Exception):
        pass

    also = (
        (Interrupted, exits.INTERRUPTED),
        (RuntimeError, exits.FAILED),
        (FileNotFoundError, exits.REFUSED),
    )
    assert _answer(capsys, _raises(Interrupted("interrupted in trial t1")), also=also) == (
        exits.INTERRUPTED,
        ["wagma-bench cmd: interrupted in trial t1"],
    )
    assert _answer(capsys, _raises(RuntimeError("sbatch failed")), also=also) == (
        exits.FAILED,
        ["wagma-bench cmd: error: sbatch failed"],
    )
    assert _answer(capsys, _raises(FileNotFoundError("no such dir")), also=also) == (
        exits.REFUSED,
        ["wagma-bench cmd: error: no such dir"],
    )
    ctrl_c = "wagma-bench: interrupted; nothing ran"
    assert _answer(capsys, _raises(KeyboardInterrupt()), interrupted=ctrl_c) == (exits.INTERRUPTED, [ctrl_c])
    assert _answer(capsys, _raises(KeyboardInterrupt()), interrupted=None) == (exits.INTERRUPTED, [])
    stopped = "wagma-bench: stopped by {signal}; nothing ran"
    assert _answer(capsys, _raises(exits.Stopped(signal.SIGTERM)), stopped=stopped) == (
        143,
        ["wagma-bench: stopped by SIGTERM; nothing ran"],
    )


def test_a_defect_prints_its_traceback_then_the_line_and_exits_1(capsys):
    code, err = _answer(capsys, _raises(KeyError("steps")))
    assert code == exits.FAILED
    assert err[0] == "Traceback (most recent call last):" and "KeyError: 'steps'" in err
    assert err[-1] == "wagma-bench cmd: error: unexpected KeyError: 'steps'"


def test_argparse_and_hydra_exits_go_through_unchanged():
    """A plain SystemExit (argparse's usage error or --help, Hydra's own) is theirs: not answered again."""
    with pytest.raises(SystemExit) as stop:
        exits.run_body("cmd", _raises(SystemExit(2)))
    assert stop.value.code == 2 and type(stop.value) is SystemExit


def test_the_simulate_command_holds_its_command_line_and_no_library():
    """cli/simulate.py parses and calls simulate/: its help text, the parser and the order of the calls. The
    prediction, comparison and output code lives under wagma_bench/simulate/ (one job a module)."""
    source = (CLI / "simulate.py").read_text()
    assert len(source.splitlines()) < 150, "cli/simulate.py: move a job into wagma_bench/simulate/"
    functions = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    assert functions == ["main", "parse", "_simulate"], functions
