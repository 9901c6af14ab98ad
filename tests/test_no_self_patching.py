"""No test patches out what it should be testing: the op's own validation (`_check_placement`,
`_check_kind`), its device's architecture (`device_arch`), resolution (`resolve`, `resolution`)
or bundle verification (`verify_bundle`). A test that did would pass with the check broken.

CPU op tests run on a fake GPU instead (tests/fake_gpu.py, the `fake_gpu` fixture), and tests of
verification use real bundles that pass it (tests/stubs.py). The rule reads every test's source:
monkeypatch/setattr/mock.patch calls, assignments to those attributes, and the Python scripts that
tests hand to subprocesses.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PROTECTED = frozenset(
    {"_check_placement", "_check_kind", "device_arch", "resolve", "resolution", "verify_bundle"}
)
PATCHERS = frozenset(
    {"setattr", "patch", "object", "delattr"}
)  # monkeypatch.*, mock.patch(.object)


def _named(node: ast.AST) -> str | None:
    """The attribute a patch call's string argument names ("a.b.verify_bundle" names the last)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.rsplit(".", 1)[-1]
    return None


def _code_in(node: ast.AST) -> str | None:
    """The text of a string literal that may be a script (f-string fields become `0`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "0" for v in node.values]
        text = "".join(str(part) for part in parts)
        return text if "\n" in text else None
    return None


def self_patches(source: str, where: str) -> list[str]:
    """where:line: what, for each patch of a protected name in `source` and its scripts."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # a string that is not a script
    found = []
    # an f-string's literal parts are read as part of the whole, not again as scripts of their own
    parts = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else None
            name = function.id if isinstance(function, ast.Name) else name
            if name in PATCHERS:
                for arg in node.args[:2]:
                    if _named(arg) in PROTECTED:
                        found.append(f"{where}:{node.lineno}: {name}(..., {_named(arg)!r})")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in PROTECTED:
                    found.append(f"{where}:{node.lineno}: assigns .{target.attr}")
        code = None if id(node) in parts else _code_in(node)
        if code is not None:
            line = getattr(node, "lineno", 0)
            found += self_patches(textwrap.dedent(code), f"{where}:{line} (script)")
    return found


def test_no_test_patches_the_ops_validation_resolution_or_verification():
    found = [
        site
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__).resolve()
        for site in self_patches(path.read_text(), str(path.relative_to(TESTS.parent)))
    ]
    assert found == [], (
        "tests patch what they should test; use the fake_gpu fixture (tests/fake_gpu.py) or real "
        "bundles (tests/stubs.py) instead:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        'monkeypatch.setattr(ops, "_check_placement", lambda *a: None)',
        'monkeypatch.setattr(ops, "device_arch", lambda index: "sm_90a")',
        'monkeypatch.setattr(op, "resolve", lambda *a: None)',
        'monkeypatch.setattr("cute_aot.runtime.loader.verify_bundle", lambda *a, **k: None)',
        'patched.setattr(FamilyOp, "resolution", fake)',
        'setattr(ops, "_check_kind", lambda *a: None)',
        'with mock.patch("cute_aot.runtime.ops.device_arch"): pass',
        'with mock.patch.object(loader, "verify_bundle"): pass',
        "ops._check_placement = lambda *a: None",
        'script = """\nfrom cute_aot.runtime import loader\nloader.verify_bundle = print\n"""',
        'script = f"""\nimport x\nx.device_arch = {ARCH!r}\n"""',
    ],
)
def test_the_rule_sees_each_way_of_patching(source):
    assert len(self_patches(source, "t.py")) == 1, source


@pytest.mark.parametrize(
    "source",
    [
        "device.device_arch.cache_clear()",
        'monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))',
        "key_function(key, ARCH)",
        'Path(__file__).resolve().parents[1]; x = """\nnot python: setattr(\n"""',
    ],
)
def test_the_rule_lets_calls_and_other_patches_through(source):
    assert self_patches(source, "t.py") == []
