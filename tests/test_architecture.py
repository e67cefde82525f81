"""The package's shape: no import cycles inside ``crag_dspy``, and the embedded LM a self-contained
subpackage that the rest of the code reaches through ``crag_dspy.lm``'s public names only."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) of every import in ``path``, function-level ones too."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.append((module, [alias.name for alias in node.names]))
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_crag_dspy_has_no_import_cycles():
    modules = {module_name(p): p for p in (ROOT / "crag_dspy").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for module, names in imports(path):
            # "from . import x" imports the submodule x when there is one
            edges |= {f"{module}.{n}" for n in names if f"{module}.{n}" in modules} or (
                {module} if module in modules else set()
            )
        graph[name] = edges - {name}

    def cycle_from(start: str) -> list[str] | None:
        stack, on_path, done = [(start, iter(sorted(graph[start])))], [start], set()
        while stack:
            _, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                stack.pop()
                done.add(on_path.pop())
            elif nxt in on_path:
                return [*on_path[on_path.index(nxt) :], nxt]
            elif nxt not in done:
                stack.append((nxt, iter(sorted(graph[nxt]))))
                on_path.append(nxt)
        return None

    cycles = [c for c in map(cycle_from, sorted(graph)) if c]
    assert not cycles, cycles[0]


@pytest.mark.parametrize("folder", ["crag_dspy", "optimize", "benchmarks"])
def test_the_embedded_lm_is_reached_through_its_package_only(folder):
    lm = ROOT / "crag_dspy" / "lm"
    for path in (ROOT / folder).rglob("*.py"):
        if lm in path.parents:
            continue
        for module, _ in imports(path):
            assert not module.startswith("crag_dspy.lm."), f"{path.relative_to(ROOT)} imports {module}"


def test_the_checks_see_what_they_check():
    # Guards the two tests above against passing because the walk found nothing.
    cli = imports(ROOT / "crag_dspy" / "cli.py")
    assert ("crag_dspy.lm", ["EMBEDDED_MODELS", "ENGINE_CHOICES", "WeightsError"]) in cli
    assert any(m == "crag_dspy.lm.factory" for m, _ in imports(ROOT / "crag_dspy" / "lm" / "__init__.py"))


def test_tests_import_their_helpers_as_neighbours_not_through_a_tests_package():
    # CI runs the `pytest` entry point, which puts tests/ on sys.path but not the repository root:
    # `from tests.fakes import ...` works under `python -m pytest` only, and broke CI once.
    through_package = [
        f"{path.name}: {module}"
        for path in sorted((ROOT / "tests").glob("*.py"))
        for module, _ in imports(path)
        if module == "tests" or module.startswith("tests.")
    ]
    assert through_package == []
