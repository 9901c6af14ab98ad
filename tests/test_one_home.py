"""One place for each decision: a test per decision that fails when a second copy appears.

- The environment is read in artifacts/settings.py only (CUTE_AOT_* variables and the few of
  other programs cute-aot reads: CC, CUDA_HOME, LD_LIBRARY_PATH, COLUMNS, the DSL's own). Other
  modules may set variables for the processes they start (aot-build's workers, a virtual GPU's
  caches), never read them.
- The cache folder has one name: settings.cache_dir.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aot", "artifacts", "kernels", "runtime")
SETTINGS = ROOT / "artifacts" / "settings.py"
WRITES = ("update", "pop", "setdefault")


def _modules():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def environment_reads(path: Path) -> list[str]:
    """file:line of every read of os.environ / os.getenv in `path` (writes are allowed)."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr == "getenv":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif node.attr == "environ":
                parent = parents.get(node)
                writes = (isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del))) or (
                    isinstance(parent, ast.Attribute) and parent.attr in WRITES)  # fmt: skip
                if not writes:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_settings_module_reads_the_environment():
    reads = [site for path in _modules() if path != SETTINGS for site in environment_reads(path)]
    assert reads == [], "read the environment through artifacts/settings.py: " + ", ".join(reads)


def test_the_rule_sees_reads_and_lets_writes_through():
    probe = ROOT / "tests" / "data" / "environment_probe.py"
    lines = {i + 1: line for i, line in enumerate(probe.read_text().splitlines())}
    flagged = sorted(int(site.rsplit(":", 1)[1]) for site in environment_reads(probe))
    assert flagged == [n for n, line in lines.items() if line.endswith("# read")]
    assert len(flagged) == 4


def test_the_cache_folder_has_one_name():
    for path in _modules():
        text = path.read_text()
        assert "def cache_dir" not in text or path == SETTINGS, path
        assert "cache_dirs" not in text, path
