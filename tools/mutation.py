"""`make mutation`: how many deliberate bugs in the core modules the unit tests catch.

For each target module (`TARGETS`, the one list to edit when a module moves), every mutant
is one change to its syntax tree:

- a comparison flipped (`<` to `<=`, `>=` to `>`, `==` to `!=`, `in` to `not in`, ...);
- a condition negated (the test of an `if`, `while`, `assert` or conditional expression);
- an integer constant moved by one (up, and down);
- a statement deleted (replaced by `pass`);
- `return x` made `return None`.

The tests are run once, unmutated, with a line tracer: which test executes which line of
the module. Then each mutant runs, in a forked child that imports the mutated module in
place of the real one, only the tests that execute the function it changed (stopping at
the first failure; `_enclosing` says why the function and not the line). A failing test
(or a child that overruns its time, or crashes) catches it; a mutant whose tests pass,
or that no test executes, survives. Mutants that cannot change behaviour are listed in
`EQUIVALENT` with the reason; they are not counted.

Usage: `python tools/mutation.py [module ...] [--survivors]` (from the repository root,
with the package importable). Exit status 1 when a module scores below `GOAL`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.95


@dataclass(frozen=True)
class Target:
    """One module under mutation: its import name, the tests run against it, and (when
    only part of it is targeted) the functions whose bodies are mutated."""

    module: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        """The module's source file."""
        return ROOT / "src" / (self.module.replace(".", "/") + ".py")


# The one place naming the modules and their tests (paths move with the core v3 layout).
TARGETS: dict[str, Target] = {
    "settle": Target("sandbox.settle", ("tests/session/test_settle.py",)),
    "tasks": Target("sandbox.tasks", ("tests/session/test_tasks.py",)),
    "arguments": Target("sandbox.arguments", ("tests/session/test_arguments.py",)),
    "output_buffer": Target(
        "sandbox.output.buffer", ("tests/output/test_buffer.py", "tests/test_output.py")
    ),
    "text_decoding": Target(
        "sandbox.output.decoding", ("tests/output/test_decoding.py", "tests/test_output.py")
    ),
    "truncation": Target(
        "sandbox.output.truncation", ("tests/output/test_truncation.py", "tests/test_output.py")
    ),
    "until_match": Target(
        "sandbox.output.until",
        ("tests/output/test_until.py", "tests/test_until_bound.py", "tests/test_output.py"),
    ),
    "shell_quoting": Target(
        "sandbox.backends.toolkit.shell",
        ("tests/toolkit/test_shell.py",),
        functions=(
            "new_tag",
            "check_tag",
            "running_tags",
            "tag_environment",
            "wrapper_argv",
            "grace_ticks",
            "kill_script",
            "interrupt_script",
            "_script",
            "command_line",
            "parse_kill_report",
        ),
    ),
}

# Mutants that cannot change behaviour: (target, mutant description) -> why. Keep it small;
# each entry is a claim a reviewer can check by reading the line.
EQUIVALENT: dict[tuple[str, str], str] = {
    # BoundedOutput.append: where the one-piece head splits, the boundaries only save work.
    (
        "output_buffer",
        "BoundedOutput.append: `spill > 0` -> `spill >= 0`",
    ): "a head of exactly its half spills nothing: an empty tail, then the same rolling",
    (
        "output_buffer",
        "BoundedOutput.append: `len(data) < self._tail_limit` -> `len(data) <= self._tail_limit`",
    ): "a chunk of exactly the tail's size then pushes the spilled bytes out of the tail:"
    " the same bytes dropped, the same count",
    (
        "output_buffer",
        "BoundedOutput.since: delete `return [bytes(self._head[max(0, offset):])]`",
    ): "without a drop the general path below returns the same one segment of the head",
    # StreamDecoder.decode: finishing a held-back character.
    (
        "text_decoding",
        "<module>: `3` -> `4`",
    ): "one byte more than the held-back character can need: the decoder stops past it"
    " all the same, and the rest is decoded from there",
    (
        "text_decoding",
        "StreamDecoder.decode: `len(data) <= _COMPLETION` -> `len(data) < _COMPLETION`",
    ): "three more bytes always finish the held-back character, so the general path"
    " then gives the same text and keeps the same partial character",
    # truncate_to_tokens: the fast path returns what the exact path below it returns.
    (
        "truncation",
        "truncate_to_tokens: delete `return Truncated(text, None)` (#2)",
    ): "without the fast path, the exact check (`len(data) <= budget`) returns the same",
    (
        "truncation",
        "truncate_to_tokens: `len(text) <= budget // 4` -> `len(text) < budget // 4`",
    ): "a text of exactly budget // 4 characters then takes the exact path: same result",
    (
        "truncation",
        "truncate_to_tokens: `4` -> `5`",
    ): "a smaller fast-path bound sends more texts to the exact path: same result",
    (
        "text_decoding",
        "_incomplete_suffix_len: `4` -> `5`",
    ): "a lead byte 4 or more back ends a complete (or invalid) sequence: 0 either way",
    (
        "text_decoding",
        "_incomplete_suffix_len: `4` -> `3`",
    ): "a lead byte 4 back ends a complete (or invalid) sequence: 0 either way",
    (
        "arguments",
        "build_command: `0` -> `-1`",
    ): "`parts[0]` is read only when `len(parts) == 1`, where `parts[-1]` is the same part",
    # BoundedOutput.append: the early exits and strict bounds only save work.
    (
        "output_buffer",
        "BoundedOutput.append: delete `return`",
    ): "an empty append then adds nothing to the head or tail and drops nothing",
    (
        "output_buffer",
        "BoundedOutput.append: delete `if not view:`",
    ): "an empty rest then adds nothing to the tail and drops nothing",
    (
        "output_buffer",
        "BoundedOutput.append: delete `return` (#2)",
    ): "an empty rest then adds nothing to the tail and drops nothing",
    (
        "output_buffer",
        "BoundedOutput.append: `room > 0` -> `room >= 0`",
    ): "with room 0 the head takes view[:0]: nothing",
    (
        "output_buffer",
        "BoundedOutput.append: `0` -> `-1`",
    ): "room is never negative; with room 0 the head takes view[:0]: nothing",
    (
        "output_buffer",
        "BoundedOutput.append: `len(view) >= self._tail_limit` -> `len(view) > self._tail_limit`",
    ): "a chunk of exactly the tail's size then rolls the tail out byte for byte: same bytes,"
    " same count",
    (
        "output_buffer",
        "BoundedOutput.append: `excess > 0` -> `excess >= 0`",
    ): "deleting tail[:0] and counting 0 changes nothing",
    (
        "output_buffer",
        "BoundedOutput.append: `0` -> `-1` (#2)",
    ): "excess is an int: > -1 is >= 0, and an excess of 0 changes nothing",
    (
        "until_match",
        "UntilMatcher.__init__: `1` -> `0`",
    ): "keeping one character more of text already searched finds nothing new",
    (
        "until_match",
        "UntilMatcher.__init__: `0` -> `-1` (#2)",
    ): "the overlap is only read for substrings; a regex never uses it",
    (
        "until_match",
        "UntilMatcher.__init__: `0` -> `1` (#2)",
    ): "the overlap is only read for substrings; a regex never uses it",
    (
        "until_match",
        "UntilMatcher.feed: `time.monotonic() >= stop` -> `time.monotonic() > stop`",
    ): "the clock landing exactly on the stop instant is not observable",
    (
        "until_match",
        "UntilMatcher.feed_async: `now >= deadline` -> `now > deadline`",
    ): "the clock landing exactly on the deadline is not observable",
    (
        "until_match",
        "UntilMatcher.feed_async: `now >= slice_end` -> `now > slice_end`",
    ): "the clock landing exactly on the slice's end is not observable",
    (
        "until_match",
        "UntilMatcher.feed_async: `0` -> `-1`",
    ): "asyncio.sleep(-1) yields once, as sleep(0) does",
    (
        "until_match",
        "UntilMatcher._step: `return False` -> `return None`",
    ): "callers only test the result's truth",
    (
        "until_match",
        "UntilMatcher._step: `return False` -> `return None` (#2)",
    ): "callers only test the result's truth",
    (
        "until_match",
        "UntilMatcher._trim: delete `return`",
    ): "the substring window is already cut to the overlap, so the regex cut is a no-op",
    (
        "until_match",
        "UntilMatcher._step: `return False` -> `return None` (#3)",
    ): "callers only test the result's truth",
    (
        "until_match",
        "byte_needle: delete `return None` (#2)",
    ): "the function then ends, which returns None all the same",
    (
        "until_match",
        "byte_needle: delete `return None` (#3)",
    ): "the function then ends, which returns None all the same",
}

# --- mutants ---------------------------------------------------------------------------

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


@dataclass
class Mutant:
    """One change: where it is, what it does, and the tree that carries it."""

    target: str
    function: str
    line: int
    end_line: int
    description: str
    at_import: bool
    tree: ast.Module = field(repr=False)

    @property
    def key(self) -> str:
        """A name that survives line moves: function, change, and the code changed."""
        return f"{self.function}: {self.description}"


def _docstring(node: ast.stmt, body: list[ast.stmt]) -> bool:
    return (
        node is body[0]
        and isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _sites(tree: ast.Module, functions: tuple[str, ...]) -> Iterator[tuple[str, ast.AST, bool]]:
    """Every node of the module that may be mutated: (enclosing scope's name, node, whether
    it runs at import: module and class level, decorators, defaults)."""

    def walk(
        node: ast.AST, scope: str, inside: bool, at_import: bool
    ) -> Iterator[tuple[str, ast.AST, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{scope}.{child.name}" if scope else child.name
                chosen = inside or not functions or child.name in functions
                for part in ast.iter_child_nodes(child):
                    in_body = part in child.body
                    if isinstance(part, ast.stmt) and not in_body:
                        continue
                    ran_at_import = at_import and (not in_body or isinstance(child, ast.ClassDef))
                    if isinstance(part, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        yield from walk(
                            ast.Module(body=[part], type_ignores=[]), name, chosen, ran_at_import
                        )
                        continue
                    if chosen and not isinstance(part, ast.Import | ast.ImportFrom):
                        yield name, part, ran_at_import
                    yield from walk(part, name, chosen, ran_at_import)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                continue
            if inside:
                yield scope or "<module>", child, at_import
            yield from walk(child, scope, inside, at_import)

    yield from walk(tree, "", not functions, True)


def _stmt_lists(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        value = getattr(node, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            yield value
    for handler in getattr(node, "handlers", []) or []:
        yield handler.body


def _deletable(node: ast.AST) -> list[tuple[list[ast.stmt], int]]:
    """The statements directly under `node` that a deletion may replace by `pass`."""
    slots = []
    for body in _stmt_lists(node):
        for index, stmt in enumerate(body):
            if isinstance(stmt, ast.Pass) or _docstring(stmt, body):
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            slots.append((body, index))
    return slots


def _span(node: ast.AST) -> tuple[int, int]:
    line = getattr(node, "lineno", 0)
    return line, getattr(node, "end_lineno", None) or line


def _changes(node: ast.AST) -> Iterator[tuple[str, Any, tuple[int, int]]]:
    """(description, apply, lines) for each mutation of `node`; `apply` changes the node
    at the same place in a copy of the tree."""
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            flipped = _FLIP.get(type(op))
            if flipped is None:
                continue

            def flip(n: ast.Compare, i: int = index, f: type[ast.cmpop] = flipped) -> None:
                n.ops[i] = f()

            probe = copy.deepcopy(node)
            flip(probe)
            yield f"`{ast.unparse(node)}` -> `{ast.unparse(probe)}`", flip, _span(node)
    if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):

        def negate(n: Any) -> None:
            n.test = ast.UnaryOp(op=ast.Not(), operand=n.test)

        yield f"negate `{ast.unparse(node.test)}`", negate, _span(node.test)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    ):
        for delta in (1, -1):

            def move(n: ast.Constant, d: int = delta) -> None:
                n.value = n.value + d

            yield f"`{node.value}` -> `{node.value + delta}`", move, _span(node)
    if isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):

            def none(n: ast.Return) -> None:
                n.value = ast.Constant(None)

            yield f"`return {ast.unparse(node.value)}` -> `return None`", none, _span(node)
    for position, (body, index) in enumerate(_deletable(node)):
        stmt = body[index]

        def delete(n: ast.AST, p: int = position) -> None:
            copied_body, i = _deletable(n)[p]
            copied_body[i] = ast.Pass()

        yield f"delete `{ast.unparse(stmt).splitlines()[0]}`", delete, _span(stmt)


def mutants(name: str, target: Target) -> list[Mutant]:
    """Every mutant of one target, each carrying its own mutated tree."""
    source = target.path.read_text()
    tree = ast.parse(source)
    found: list[Mutant] = []
    seen: dict[str, int] = {}
    for site_index, (function, node, at_import) in enumerate(_sites(tree, target.functions)):
        for change_index, (description, _, (line, end)) in enumerate(_changes(node)):
            mutated = ast.parse(source)  # a fresh tree per mutant: one change each
            twin = list(_sites(mutated, target.functions))[site_index][1]
            twin_description, apply, _ = list(_changes(twin))[change_index]
            if twin_description != description:  # both trees walk the same way
                raise RuntimeError(f"mutant mismatch at {description}")
            apply(twin)
            ast.fix_missing_locations(mutated)
            key = f"{function}: {description}"
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                description = f"{description} (#{seen[key]})"
            found.append(Mutant(name, function, line, end, description, at_import, mutated))
    return found


# --- running ---------------------------------------------------------------------------


class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `name` from a given code object instead of its file."""

    def __init__(self, name: str, path: Path, code: Any) -> None:
        self._name, self._path, self._code = name, path, code

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self._name:
            return None
        return importlib.util.spec_from_file_location(fullname, self._path, loader=self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        exec(self._code, module.__dict__)


class _LineRecorder:
    """A pytest plugin: per test, the lines of the target files it executes."""

    def __init__(self, files: set[str]) -> None:
        self.files = files
        self.lines: dict[str, set[tuple[str, int]]] = {}
        self.outcomes: dict[str, str] = {}
        self.durations: dict[str, float] = {}
        self._current: set[tuple[str, int]] | None = None

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename in self.files:
            return self._local
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self._current is not None:
            self._current.add((frame.f_code.co_filename, frame.f_lineno))
        return self._local

    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        self._current = self.lines.setdefault(item.nodeid, set())
        sys.settrace(self._global)
        threading.settrace(self._global)
        started = time.perf_counter()
        try:
            yield
        finally:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
            self.durations[item.nodeid] = time.perf_counter() - started
            self._current = None

    pytest_runtest_protocol.hookwrapper = True  # type: ignore[attr-defined]

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        else:
            self.outcomes.setdefault(report.nodeid, report.outcome)


_PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-o", "addopts=--strict-markers", "-x"]


def _in_child(run: Any, timeout: float, failed: Path | None = None) -> tuple[str, Any]:
    """Run `run()` in a forked child; (how it ended, its JSON result). When the file
    `failed` appears (a test failed), the child is stopped at once: ("failed", None)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 70
            try:
                if not os.environ.get("MUTATION_DEBUG"):
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, 1)
                    os.dup2(devnull, 2)
                result = run()
                Path(out.name).write_text(json.dumps(result))
                code = 0
            except BaseException:
                if os.environ.get("MUTATION_DEBUG"):
                    import traceback

                    traceback.print_exc()
            finally:
                os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if failed is not None and failed.exists():
                # The verdict is in; a teardown that hangs on the mutant need not end.
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "failed", None
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "timeout", None
            time.sleep(0.02)
        if os.waitstatus_to_exitcode(status) != 0:
            return "crashed", None
        text = Path(out.name).read_text()
        return "ok", json.loads(text) if text else None


def _forget_ours() -> None:
    """Drop the package and the tests from the module cache, so that they are imported
    again (against the mutant) while third-party modules stay loaded."""
    for name in list(sys.modules):
        if name.split(".")[0] in ("sandbox", "tests"):
            del sys.modules[name]


def _run_pytest(args: list[str], plugins: list[Any]) -> int:
    import pytest

    os.chdir(ROOT)
    return int(pytest.main([*_PYTEST_ARGS, *args], plugins=plugins))


def baseline(target: Target) -> dict[str, Any]:
    """Run the target's tests unmutated: per test, the lines it executes."""
    files = {str(target.path)}

    def run() -> dict[str, Any]:
        _forget_ours()
        recorder = _LineRecorder(files)
        code = _run_pytest([*target.tests], [recorder])
        return {
            "code": code,
            "lines": {k: sorted(n for _, n in v) for k, v in recorder.lines.items()},
            "outcomes": recorder.outcomes,
            "durations": recorder.durations,
        }

    how, result = _in_child(run, timeout=600)
    if how != "ok" or result is None or result["code"] != 0:
        failed = [k for k, v in (result or {}).get("outcomes", {}).items() if v == "failed"]
        raise SystemExit(f"{target.module}: the unmutated tests do not pass ({how}): {failed}")
    return result


def run_mutant(
    target: Target, mutant: Mutant, tests: list[str], timeout: float, per_test: float
) -> str:
    """`caught`, `survived`, `timeout` or `crashed` for one mutant. Each test gets
    `per_test` seconds (pytest-timeout: a test that hangs fails, so the mutant is
    caught by a failing test, not by the child's clock), the child `timeout` in all."""
    code = compile(mutant.tree, str(target.path), "exec")
    with tempfile.TemporaryDirectory() as folder:
        failed = Path(folder) / "failed"

        def run() -> int:
            _forget_ours()
            sys.meta_path.insert(0, _MutantFinder(target.module, target.path, code))
            return _run_pytest([f"--timeout={per_test:.0f}", *tests], [_FirstFailure(failed)])

        how, result = _in_child(run, timeout, failed)
    if how == "failed":
        return "caught"
    if how != "ok":
        return how
    return "survived" if result == 0 else "caught"


class _FirstFailure:
    """A pytest plugin (in the child) that creates `path` when a test fails."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            self.path.touch()


def _function_spans(path: Path) -> list[tuple[int, int]]:
    """(first, last) line of every function in the module."""
    return [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _enclosing(spans: list[tuple[int, int]], line: int, end: int) -> tuple[int, int]:
    """The innermost function holding lines `line`..`end` (else those lines alone).

    Tests are chosen by the function they execute, not the line: a line tracer misses
    the lines a coroutine runs after it is resumed by `throw()` (a cancellation), and
    those are the lines that matter most here."""
    holding = [(a, b) for a, b in spans if a <= line and end <= b]
    return min(holding, key=lambda span: span[1] - span[0]) if holding else (line, end)


def score(
    name: str, target: Target, *, show: bool, budget_factor: float = 5.0
) -> tuple[int, int, list[str], int]:
    """(caught, counted, survivors, timeouts) for one target; `timeouts` are among the
    caught (a child that overran its whole budget), listed so that a loaded machine
    shows."""
    base = baseline(target)
    by_line: dict[int, list[str]] = {}
    for test, lines in base["lines"].items():
        for line in lines:
            by_line.setdefault(line, []).append(test)
    caught = counted = timeouts = 0
    survivors: list[str] = []
    spans = _function_spans(target.path)
    for mutant in mutants(name, target):
        if (name, mutant.key) in EQUIVALENT:
            continue
        counted += 1
        if mutant.at_import:  # runs before any test: every test may depend on it
            tests = sorted(base["lines"])
        else:
            first, last = _enclosing(spans, mutant.line, mutant.end_line)
            tests = sorted({t for line in range(first, last + 1) for t in by_line.get(line, [])})
        if not tests:
            survivors.append(f"line {mutant.line}: {mutant.key} (no test runs it)")
            continue
        # A test hanging on a mutant fails at its own timeout, scaled from the slowest
        # selected test's unmutated time (raise `--budget-factor` on a loaded machine);
        # the child's clock only stops a run that hangs outside any test, and counts
        # its imports and collection, which a busy machine slows down.
        slowest = max(base["durations"].get(t, 1.0) for t in tests)
        per_test = 10 + budget_factor * slowest
        budget = 120 + 2 * per_test + 4 * sum(base["durations"].get(t, 1.0) for t in tests)
        outcome = run_mutant(target, mutant, tests, budget, per_test)
        if outcome == "survived":
            survivors.append(f"line {mutant.line}: {mutant.key}")
        else:
            caught += 1
            timeouts += outcome == "timeout"
        if show:
            print(f"  {outcome:8} line {mutant.line}: {mutant.key}", flush=True)
    return caught, counted, survivors, timeouts


def main(argv: list[str] | None = None) -> int:
    """Score the named targets (all by default); print survivors with `--survivors`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", metavar="target", help=", ".join(TARGETS))
    parser.add_argument("--tests", nargs="+", help="run these tests instead of the target's")
    parser.add_argument("--survivors", action="store_true", help="list surviving mutants")
    parser.add_argument("--verbose", action="store_true", help="print every mutant's outcome")
    parser.add_argument(
        "--budget-factor",
        type=float,
        default=5.0,
        help="a test's time budget on a mutant: 10 s + this times the slowest selected "
        "test's unmutated time (default 5)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    # Imported once here, shared by every forked child (the package itself never is).
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    # What the tests import (SDKs, the fixtures' dependencies) is imported once here and
    # shared by every forked child; each child imports `sandbox` and `tests` afresh.
    import pytest  # noqa: F401

    import tests.conftest  # noqa: F401

    names = args.targets or list(TARGETS)
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    low = False
    total_caught = total = 0
    for name in names:
        started = time.monotonic()
        target = TARGETS[name]
        if args.tests:
            target = Target(target.module, tuple(args.tests), target.functions)
        caught, counted, survivors, timeouts = score(
            name, target, show=args.verbose, budget_factor=args.budget_factor
        )
        share = caught / counted if counted else 1.0
        low |= share < GOAL
        total_caught += caught
        total += counted
        elapsed = time.monotonic() - started
        print(
            f"{name:14} {caught:4}/{counted:<4} {share:6.1%}  ({elapsed:.0f} s, "
            f"{timeouts} caught by a timeout)",
            flush=True,
        )
        if args.survivors:
            for survivor in survivors:
                print(f"    survived {survivor}")
    if total:
        print(f"{'all':14} {total_caught:4}/{total:<4} {total_caught / total:6.1%}")
    return 1 if low else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
