"""Every command ends through one function, :func:`wagma_bench.exits.run_body`: what a command's body raises
becomes the documented exit code and one line on stderr. Checked on the code (no command module of ``cli/``
ends the process itself, and each command's ``main`` returns the mapper's answer) and on the mapper's answers,
kind by kind."""

from __future__ import annotations

import ast
import errno
import os
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


PACKAGE = CLI.parent
# where ending the process by itself is the job: the one table, the program's entry point (which hands the
# table's code to the interpreter), and a local rank's entry point, which ends its process without the
# interpreter's finalization (runtime/launch.py)
ALLOWED = {"exits.py": None, "__main__.py": None, "runtime/launch.py": {"_spawned_rank", "_exit_now"}}
CODE_NAMES = {"rc", "code", "returncode", "exitcode", "exit_code"}
ENDERS = {"exit", "_exit", "Stop", "stop", "end", "die_now", "stopped_by"}


# what computes an exit code: exits.py's own helpers and tables, which only it and the outcome's mapping
# (exits.outcome_code, exits.answer) may use; a code computed elsewhere (``exits.stopped_by(late)``, ``128 +
# sig``) is a run's end reaching the exit code outside its RunOutcome
COMPUTERS = {"stopped_by", "code_of", "OUTCOME_CODES", "RAISED"}


def _computed_code(node: ast.AST) -> str | None:
    """What ``node`` is, if it computes an exit code outside the table: ``exits.stopped_by`` (or another of
    :data:`COMPUTERS`) used, ``stopped_by(...)`` called, or ``128 +`` a signal."""
    if isinstance(node, ast.Attribute) and _name(node.value) == "exits" and node.attr in COMPUTERS:
        return f"exits.{node.attr} outside the table"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in COMPUTERS:
        return f"{node.func.id}() outside the table"
    sides = (node.left, node.right) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) else ()
    if any(isinstance(s, ast.Constant) and s.value == 128 for s in sides):
        return "128 + a signal outside the table"
    return None


def _int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _code_literal(node: ast.AST) -> str | None:
    """What ``node`` is, if it writes an exit code as a number: one passed to something that ends a command
    or a process, or compared with a variable that holds an exit code (``rc == 3``; 0, any program's success,
    may be compared)."""
    if isinstance(node, ast.Call) and _name(node.func) in ENDERS:
        literal = any(_int(a) for a in [*node.args, *(k.value for k in node.keywords)])
        return f"{_name(node.func)}(<int>)" if literal else None
    if not isinstance(node, ast.Compare):
        return None
    sides = [node.left, *node.comparators]
    literals = [c for s in sides for c in (s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s])]
    if any(_name(s) in CODE_NAMES for s in sides) and any(_int(c) and c.value != 0 for c in literals):
        return "an exit code compared with a number"
    return None


def _returned_literals(tree: ast.AST, names: set[str] | None = None) -> list[ast.AST]:
    """``return <int>`` in the functions ``names`` of ``tree`` (None: every function)."""
    return [
        r
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef) and (names is None or f.name in names)
        for r in ast.walk(f)
        if isinstance(r, ast.Return) and r.value is not None and _int(r.value)
    ]


def _called_libraries(tree: ast.AST) -> dict[str, set[str]]:
    """The package modules a command returns a call of (``return commbench.bench(...)``): module -> names."""
    modules = {
        a.asname or a.name: f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("wagma_bench")
        for a in n.names
    }
    called: dict[str, set[str]] = {}
    for r in ast.walk(tree):
        if isinstance(r, ast.Return) and isinstance(r.value, ast.Call):
            f = r.value.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
                called.setdefault(modules[f.value.id], set()).add(f.attr)
    return called


def exit_breaches(root: Path) -> list[str]:
    """Every place under ``root`` (a package like wagma_bench/) that ends a command or a process without the
    one table (:mod:`wagma_bench.exits`), or writes an exit code as a number: the process-ending calls of
    :func:`_ends_the_process` (a reference to ``sys.exit`` or ``os._exit`` too), a code as a literal, and
    ``return <int>`` from a command's body or from the library function it returns the result of."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        allowed = ALLOWED.get(rel, set())
        exempt = (
            set()
            if allowed is None
            else {id(n) for f in ast.walk(tree) if getattr(f, "name", None) in allowed for n in ast.walk(f)}
        )
        if allowed is None:
            continue
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            what = _ends_the_process(node) or _code_literal(node) or _computed_code(node)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and (node.value.id, node.attr) in (("sys", "exit"), ("os", "_exit"))
                and id(node) not in called
            ):
                what = f"{node.value.id}.{node.attr} (a reference)"
            if what is not None and id(node) not in exempt:
                found.append(f"{rel}:{node.lineno}: {what}")
        if rel.startswith("cli/"):
            found += [f"{rel}:{r.lineno}: return <int>" for r in _returned_literals(tree)]
            for module, names in _called_libraries(tree).items():
                lib = root / (module.removeprefix("wagma_bench.").replace(".", "/") + ".py")
                if lib.is_file():
                    found += [
                        f"{lib.relative_to(root).as_posix()}:{r.lineno}: return <int>"
                        for r in _returned_literals(ast.parse(lib.read_text()), names)
                    ]
    return sorted(set(found))


def test_nothing_outside_the_exit_table_ends_a_command_or_writes_an_exit_code():
    """A module that exits by itself, writes a code as a number, or computes one (``128 + sig``,
    ``exits.stopped_by``) bypasses the one table: its code and line would be its own. Only exits.py and a
    local rank's entry point end a process themselves, and a run's end becomes a code only from its
    RunOutcome (``exits.outcome_code``, ``exits.answer``)."""
    assert not exit_breaches(PACKAGE), exit_breaches(PACKAGE)


def test_the_exit_check_fails_on_each_planted_breach(tmp_path):
    """The package's files with one breach planted at a time: each is found, named by file and line (the
    command comm-bench returns what campaign/commbench.py's ``bench`` returns)."""
    copy = tmp_path / "wagma_bench"
    planted = {
        "runtime/supervise.py": "import sys\nsys.exit(2)\n",
        "runtime/partition.py": "import os\nEXIT = os._exit\n",
        "campaign/sweep_jobs.py": "def rc_of(rc):\n    return rc == 3\n",
        "record/events.py": "from wagma_bench import exits\nexits.stop('no', 2)\n",
        "cli/claims.py": "def extra():\n    return 1\n",
        "campaign/commbench.py": "def bench():\n    return 0\n",
        # a run's end reaching the exit code outside its RunOutcome (as cli/run.py did with a late signal)
        "cli/run.py": "def late(sig):\n    print(exits.stopped_by(sig))\n",
        "runtime/run.py": "def code(sig):\n    print(128 + sig)\n",
        "record/rundir.py": "from wagma_bench import exits\nCODE = exits.OUTCOME_CODES['failed']\n",
    }
    for rel in [*planted, "cli/commbench.py"]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_text((PACKAGE / rel).read_text())
    for rel, code in planted.items():
        target = copy / rel
        before = target.read_text()
        target.write_text(before + "\n\n" + code)
        breaches = exit_breaches(copy)
        target.write_text(before)
        assert len(breaches) == 1 and breaches[0].startswith(rel + ":"), (rel, breaches)
    assert not exit_breaches(copy)


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
    """A command raises typed errors, or declares which of its libraries' errors are which (``exits.typed``),
    and the one table answers them (an interruption's line has no ``error:``); ``interrupted`` and
    ``stopped`` are a command's own words for Ctrl-C and a stop signal (None: no line)."""
    from wagma_bench.errors import Interrupted, OperationFailed

    assert _answer(capsys, _raises(Interrupted("interrupted in trial t1"))) == (
        exits.INTERRUPTED,
        ["wagma-bench cmd: interrupted in trial t1"],
    )
    assert _answer(capsys, _raises(OperationFailed("sbatch failed"))) == (
        exits.FAILED,
        ["wagma-bench cmd: error: sbatch failed"],
    )
    kinds = {FileNotFoundError: ConfigError, RuntimeError: OperationFailed}
    for err, code in (
        (FileNotFoundError("no such dir"), exits.REFUSED),
        (RuntimeError("no such dir"), exits.FAILED),
    ):
        assert _answer(capsys, lambda err=err: exits.typed(kinds, _raises(err))) == (
            code,
            ["wagma-bench cmd: error: no such dir"],
        )
    # a typed error passes exits.typed as it is
    assert _answer(capsys, lambda: exits.typed(kinds, _raises(SymlinkRefused(40, "a link"))))[0] == 2
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


def test_a_signal_as_the_ranks_end_reaches_the_exit_code_through_the_outcome(tmp_path):
    """A stop signal that the launcher takes while it writes a run's record (its ranks ended, the phase
    ``finishing``) is folded into the run's outcome by the launch: a completed run stays completed, carries
    the signal, and the table answers it with 128 + it and one line; a failed run keeps its code; the signal
    stays noted, so a next job of ``-m`` does not start. Driven here on the signal state (the window in a
    real run is milliseconds)."""
    from wagma_bench.runtime import signals
    from wagma_bench.runtime.run import RunOutcome, signalled_as_it_ended

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    completed, failed = RunOutcome("completed", tmp_path), RunOutcome("failed", tmp_path, line="rank 1 died")
    try:
        signals.finishing()
        assert signalled_as_it_ended(completed) is completed and exits.outcome_code(completed) == exits.OK
        os.kill(os.getpid(), signal.SIGTERM)  # noted, not fatal: the record is being written
        ended = signalled_as_it_ended(completed)
        assert (ended.status, ended.signal, exits.outcome_code(ended)) == ("completed", signal.SIGTERM, 143)
        with pytest.raises(exits.Stop) as stop:
            exits.answer(ended)
        line = "wagma-bench: SIGTERM as the run ended: its record is whole (above); exit 143"
        assert (stop.value.code, stop.value.text, stop.value.error) == (143, line, False)
        assert signalled_as_it_ended(failed) is failed and exits.outcome_code(failed) == exits.FAILED
        with pytest.raises(exits.Stopped):  # under -m: the next job's start ends the sweep
            signals.starting()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signals._early.clear()
        signals._phase, signals._ctrl_c = "none", None
