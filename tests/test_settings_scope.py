"""Tests set CUTE_AOT_* settings in-process with `settings.scope` (or the `settings_scope`
fixture), not with `monkeypatch.setenv`: the environment is for what a child process must see.

A scan of tests/*.py finds every `<...>.setenv(NAME, ...)` / `<...>.delenv(NAME)` of a declared
setting (artifacts/core/settings.py) in a function, or in module-level code (tables of lambdas),
that starts no child process, directly or through a helper of its module that does (found by
following the module's own functions), and fails on it. A child process is a `subprocess` call,
`os.fork`/`exec*`/`spawn*`, a `multiprocessing` context, process or pool, a process pool
executor, or a click `CliRunner.invoke(..., env=...)`: in-process, but a scoped value would win
over the environment it sets. Names the scan cannot read (a variable from elsewhere) are not
flagged; variables that are no setting (CC, COLUMNS, a test's own) are not its business.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cute_aot.artifacts.core import settings
from tests.conftest import child_env

TESTS = Path(__file__).resolve().parent
SETTING_NAMES = frozenset(setting.name for setting in settings.SETTINGS)
SETTING_GROUPS = {"SETTINGS": settings.SETTINGS, "ACTIVATING": settings.ACTIVATING}
ENV_CALLS = {"setenv", "delenv"}
# Calls that start a process: by module (`subprocess.run`, `multiprocessing.Process`, ...) and
# by name, as imported or as the method of a context or executor.
PROCESS_MODULES = {"subprocess", "multiprocessing", "mp"}
OS_STARTS = ("fork", "exec", "spawn", "posix_spawn", "system", "popen")
PROCESS_NAMES = {
    "Popen",
    "check_call",
    "check_output",
    "get_context",
    "Process",
    "Pool",
    "ProcessPoolExecutor",
    "runpytest_subprocess",
    "spawn",
}
# function (file::name) -> why it may set a setting in the environment without starting a
# process itself (none now).
ALLOWED: dict[str, str] = {
    "test_settings_scope.py::test_the_environment_is_read_as_it_is_now": (
        "the environment reader itself is under test"
    ),
}


def _called_name(call: ast.Call) -> tuple[str | None, str]:
    """(module or object name, function name) of a call: `subprocess.run` -> ("subprocess",
    "run"), `run(...)` -> (None, "run")."""
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value
        return (owner.id if isinstance(owner, ast.Name) else None), func.attr
    if isinstance(func, ast.Name):
        return None, func.id
    return None, ""


def _starts_process_itself(call: ast.Call, imported: set[str]) -> bool:
    owner, name = _called_name(call)
    if owner in PROCESS_MODULES:
        return True
    if owner == "os" and name.startswith(OS_STARTS):
        return True
    if name in PROCESS_NAMES or (owner is None and name in imported):
        return True
    # CliRunner().invoke(..., env=...): runs in this process, but with that environment
    return name == "invoke" and any(keyword.arg == "env" for keyword in call.keywords)


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    """Every function of the module by name (top-level ones and the methods of its classes),
    and "<module>": the statements outside them (tables of lambdas a test calls)."""
    found: dict[str, ast.AST] = {}
    rest = []
    for node in tree.body:
        bodies = node.body if isinstance(node, ast.ClassDef) else [node]
        for item in bodies:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[item.name] = item
            elif item is node:
                rest.append(item)
    found["<module>"] = ast.Module(body=rest, type_ignores=[])
    return found


def _process_starters(tree: ast.Module) -> set[str]:
    """Names of the module's functions that start a process, directly or by calling another."""
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in {"subprocess", "multiprocessing"}
        for alias in node.names
    }
    functions = _functions(tree)
    calls = {
        name: [node for node in ast.walk(function) if isinstance(node, ast.Call)]
        for name, function in functions.items()
    }
    starters = {
        name
        for name, found in calls.items()
        if any(_starts_process_itself(call, imported) for call in found)
    }
    while True:  # callers of a starter start one too
        more = {
            name
            for name, found in calls.items()
            if name not in starters and any(_called_name(c)[1] in starters for c in found)
        }
        if not more:
            return starters
        starters |= more


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "text" assignments."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _loop_values(function: ast.AST, variable: str, constants: dict[str, str]) -> set[str]:
    """What a `for <variable> in <literal of names or settings>` loop in `function` binds."""
    values: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            if node.target.id != variable:
                continue
            items = node.iter
            if isinstance(items, ast.Attribute) and items.attr in SETTING_GROUPS:
                values |= {setting.name for setting in SETTING_GROUPS[items.attr]}
            elif isinstance(items, (ast.Tuple, ast.List, ast.Set)):
                for item in items.elts:
                    values |= _names(item, function, constants)
    return values


def _names(node: ast.AST, function: ast.AST, constants: dict[str, str]) -> set[str]:
    """The variable names an argument can be, as far as the module says (empty: unknown)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        if node.id in constants:
            return {constants[node.id]}
        return _loop_values(function, node.id, constants)
    if isinstance(node, ast.Attribute):
        if node.attr == "name" and isinstance(node.value, ast.Attribute):
            setting = getattr(settings, node.value.attr, None)  # settings.MODE.name
            return {setting.name} if isinstance(setting, settings.Setting) else set()
        if node.attr == "name" and isinstance(node.value, ast.Name):
            return _loop_values(function, node.value.id, constants)  # for setting in SETTINGS
        setting = getattr(settings, node.attr, None)  # a Setting itself (settings.MODE)
        return {setting.name} if isinstance(setting, settings.Setting) else set()
    return set()


def settings_in_the_environment(source: str, filename: str = "<test>") -> list[str]:
    """`file::function:line NAME` for each setting set or unset through the environment by a
    function that starts no process."""
    tree = ast.parse(source, filename)
    constants = _constants(tree)
    starters = _process_starters(tree)
    found = []
    for name, function in _functions(tree).items():
        if name in starters or f"{filename}::{name}" in ALLOWED:
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            if _called_name(node)[1] not in ENV_CALLS:
                continue
            for variable in sorted(_names(node.args[0], function, constants) & SETTING_NAMES):
                found.append(f"{filename}::{name}:{node.lineno} {variable}")
    return found


def test_tests_set_settings_with_scope_unless_a_child_process_reads_them():
    found = [
        site
        for path in sorted(TESTS.glob("*.py"))
        for site in settings_in_the_environment(path.read_text(), path.name)
    ]
    assert not found, (
        "these functions start no process, so the setting needs no environment: use "
        "`with settings.scope(NAME=value)` or the settings_scope fixture (or allow it in "
        "tests/test_settings_scope.py with why):\n" + "\n".join(found)
    )


PLANTED = """
import subprocess
from subprocess import run as run_child
from cute_aot.artifacts.core import settings

LOG = "CUTE_AOT_MISS_LOG"


def _child(code):
    return subprocess.run(["python", "-c", code])


def _through_a_helper(code):
    return _child(code)


def test_in_process(monkeypatch):
    monkeypatch.setenv("CUTE_AOT_MODE", "aot")
    monkeypatch.setenv(LOG, "x")
    monkeypatch.delenv(settings.BUNDLES.name, raising=False)
    for name in ("CUTE_AOT_HOST", "AWS_REGION"):
        monkeypatch.delenv(name)
    for setting in settings.ACTIVATING:
        monkeypatch.delenv(setting.name)


def test_a_child_reads_it(monkeypatch):
    monkeypatch.setenv("CUTE_AOT_MODE", "aot")
    _through_a_helper("")


def test_an_imported_run(monkeypatch):
    monkeypatch.setenv("CUTE_AOT_MODE", "aot")
    run_child(["true"])


def test_a_cli_runner_environment(monkeypatch):
    monkeypatch.setenv("CUTE_AOT_MODE", "aot")
    CliRunner().invoke(main, [], env={"CUTE_AOT_BUNDLES": "x"})


def test_not_a_setting(monkeypatch):
    monkeypatch.setenv("CUTE_AOT_TEST_COMPILE_LOG", "x")
    monkeypatch.setenv("COLUMNS", "200")


CASES = {"trusted": lambda m: m.setenv(settings.TRUSTED_KEYS.name, "k")}
"""


def test_the_scan_finds_a_setting_set_in_process_and_passes_what_a_child_reads():
    found = settings_in_the_environment(PLANTED, "planted.py")
    activating = [f"planted.py::test_in_process:24 {s.name}" for s in settings.ACTIVATING]
    assert found == [
        "planted.py::test_in_process:18 CUTE_AOT_MODE",
        "planted.py::test_in_process:19 CUTE_AOT_MISS_LOG",
        "planted.py::test_in_process:20 CUTE_AOT_BUNDLES",
        "planted.py::test_in_process:22 CUTE_AOT_HOST",
        *sorted(activating),
        "planted.py::<module>:47 CUTE_AOT_TRUSTED_KEYS",
    ]


# -- the fixture, and what reads a setting another way ----------------------------------------
# (scope itself: tests/test_one_home.py::test_scope_sets_settings_for_this_process_only)
def test_the_fixture_scopes_settings_for_the_test(settings_scope):
    settings_scope(CUTE_AOT_HOST="fixture-host")
    assert settings.host_name() == "fixture-host"
    settings_scope(CUTE_AOT_HOST="again")  # later calls win, all undone at the end
    assert settings.host_name() == "again"


def test_a_child_gets_the_scoped_settings_only_through_child_env(settings_scope, monkeypatch):
    monkeypatch.setenv(settings.HOST.name, "from-the-environment")  # what a child inherits
    settings_scope(CUTE_AOT_HOST="scoped", CUTE_AOT_MISS_LOG=None)
    monkeypatch.setenv(settings.MISS_LOG.name, "unset-in-process")
    code = (
        "from cute_aot.artifacts.core import settings as s; print(s.HOST.raw(), s.MISS_LOG.raw())"
    )
    inherited = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    given = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(X="1")
    )
    assert inherited.stdout.split() == ["from-the-environment", "unset-in-process"]
    assert given.stdout.split() == ["scoped", "None"], given.stderr


def test_what_reads_a_setting_by_name_sees_the_scope(settings_scope):
    """`aot-cache env` lists the variables by name: an override shows there too."""
    settings_scope(CUTE_AOT_HOST="scoped", CUTE_AOT_MODE=None)
    assert settings.environment([settings.HOST.name, settings.MODE.name]) == {
        settings.HOST.name: "scoped"
    }
    assert settings.current()[settings.HOST.name] == "scoped"


def test_tool_process_disables_the_hook_in_process_too(settings_scope):
    settings_scope(CUTE_AOT_DISABLE="0")
    with settings.tool_process():
        assert settings.disabled()
    assert not settings.disabled()


def test_the_environment_is_read_as_it_is_now(monkeypatch):
    """Settings and the DSL's variables are read from os.environ at every call, through its own
    mapping (no exception per unset name): each change shows at once, an unset name reads as
    unset, a value that is not UTF-8 reads as os.environ gives it, and a parsed value is
    parsed again when it changes. A bad value fails every time it is read, not once."""
    name, dsl_name = settings.MODE.name, "CUTE_DSL_LINEINFO"
    monkeypatch.delenv(name, raising=False)
    assert settings.MODE.value() == "auto"
    monkeypatch.setenv(name, " AOT ")
    assert settings.MODE.value() == "aot"
    monkeypatch.setenv(name, "never")
    for _ in range(2):
        with pytest.raises(settings.SettingError, match="CUTE_AOT_MODE='never'"):
            settings.MODE.value()
    monkeypatch.delenv(name)
    assert settings.MODE.value() == "auto"
    odd = os.fsdecode(b"caf\xe9")  # as os.environ decodes bytes that are not UTF-8
    monkeypatch.setenv(dsl_name, odd)
    assert settings.environment([dsl_name, "CUTE_DSL_NEVER_SET_ANYWHERE"]) == {dsl_name: odd}
    monkeypatch.delenv(dsl_name)
    assert settings.environment([dsl_name]) == {}
