"""The package layering of core/__init__.py, checked on the source.

Every ``.py`` file of the project's top-level packages is parsed (ast, so imports inside
functions and under ``if TYPE_CHECKING:`` count too, and so do ``importlib.import_module("x")``
calls and ``"package.module:Name"`` strings naming a module to import later) and each import of
another project package is checked against :data:`ALLOWED`. ``cli.py`` sits on top and
``bench/`` and ``tests/`` may import anything, so they are not checked; no package may import
them. Inside ``experiments/``, no study (:data:`STUDIES`) imports another.

The host/image split is drawn by packages: the workload images carry the packages of
:data:`IMAGE_PACKAGES` whole (``.dockerignore`` keeps out only generated files and caches), and
no module of them imports a host-side package of the project (``store``: the run-directory
format, the profile database) or a third-party package that ``images/requirements.txt`` does
not install (:data:`HOST_ONLY` names the usual suspects).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: package -> the other project packages it may import.
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "workloads": frozenset({"core"}),
    # What the host stores and reads back (the run directory, the profile database).
    "store": frozenset({"core", "workloads"}),
    "datagen": frozenset({"core", "workloads"}),
    "tracing": frozenset({"core", "workloads", "store"}),
    "analysis": frozenset({"core", "workloads", "store"}),
    "images": frozenset({"core", "workloads", "store"}),
    "experiments": frozenset(
        {"core", "workloads", "store", "datagen", "tracing", "analysis", "images"}
    ),
    # The CLI's commands (cli.py assembles them): a thin call into any package below.
    "commands": frozenset(
        {"core", "workloads", "store", "datagen", "tracing", "analysis", "images", "experiments"}
    ),
}

#: The packages the workload images carry, whole (images/Dockerfile.workload copies them).
IMAGE_PACKAGES: frozenset[str] = frozenset({"core", "workloads"})
#: Files of the image packages that the images do not take from the host: generated there
#: (.dockerignore leaves them out; every image generates its own at build time).
GENERATED: tuple[str, ...] = ("workloads/sophon/protos/*_pb2*.py",)
#: Third-party packages the host has and the images do not: never imported by an image package.
#: (The rule itself is images/requirements.txt; these are named so that a slip reads plainly.)
HOST_ONLY: frozenset[str] = frozenset(
    {"pandas", "pyarrow", "plotly", "docker", "click", "numba", "rich"}
)

#: Project modules outside the packages: nothing in a package may import them.
TOP: frozenset[str] = frozenset({"cli", "bench", "tests"})

#: The studies of experiments/: none may import another. What two of them share lives where
#: each can reach it: experiments/study_state.py, analysis/ (figures of a run) or tracing/.
STUDIES: frozenset[str] = frozenset(
    f"experiments.{name}" for name in ("grouping", "sophon", "hfta", "stalls", "dlio", "fidelity")
)

_MODULE_STRING = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$")


def packages() -> list[str]:
    """Directories at the repository root that are Python packages."""
    return sorted(p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").is_file())


def package_files(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_project_module(dotted: str) -> bool:
    """True when ``dotted`` names a module or package file of the repository."""
    base = REPO.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def imports_of(path: Path, module: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import in ``path``, wherever it appears;
    ``module``: the file's module name (by default from its place in the repository)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = module if module is not None else _module_name(path)
    package_parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            yield node.lineno, name
            # `from pkg import mod` imports pkg.mod: the module is what the code depends on.
            for alias in node.names:
                if _is_project_module(f"{name}.{alias.name}"):
                    yield node.lineno, f"{name}.{alias.name}"
        elif isinstance(node, ast.Call):
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if (
                called in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                yield node.lineno, node.args[0].value
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and _MODULE_STRING.match(node.value)
        ):
            # "datagen.unet3d" or "workloads.unet3d.task:UNet3DTask": imported by name later.
            dotted = node.value.partition(":")[0]
            if _is_project_module(dotted):
                yield node.lineno, dotted


def package_imports() -> list[tuple[str, str, int, str]]:
    """(importing package, file relative to the repo, line, imported top-level name) for every
    import of another project package or top-level module."""
    project = set(packages()) | TOP
    found = []
    for package in packages():
        for path in package_files(package):
            for line, name in imports_of(path):
                top = name.split(".")[0]
                if top in project and top != package:
                    found.append((package, str(path.relative_to(REPO)), line, top))
    return found


def test_the_rules_cover_every_package() -> None:
    # A new top-level package needs its place in the layering (here and in core/__init__.py).
    assert set(packages()) == set(ALLOWED)


def test_the_import_scanner_sees_every_kind_of_import(tmp_path: Path) -> None:
    # The scanner must not miss the forms that hide a dependency: inside a function, relative,
    # `from pkg import module`, and modules imported by name.
    source = REPO / "workloads" / "registry.py"
    names = {name for _, name in imports_of(source)}
    assert "core.errors" in names
    assert "workloads" in names  # `from workloads import training` inside WorkloadSpec.run
    assert "workloads.training" in names
    assert any(n.startswith("workloads.unet3d.task") for n in names)  # "module:Class" strings
    generators = {name for _, name in imports_of(REPO / "datagen" / "registry.py")}
    assert {"datagen.unet3d", "datagen.bert", "datagen.dlrm", "datagen.images"} <= generators


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_layering(package: str) -> None:
    allowed = ALLOWED[package]
    bad = [
        f"{path}:{line} imports {top}"
        for importer, path, line, top in package_imports()
        if importer == package and top not in allowed
    ]
    may = ", ".join(sorted(allowed)) or "no other project package"
    assert not bad, f"{package} may import only {may}:\n  " + "\n  ".join(bad)


def test_no_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = {p: set() for p in packages()}
    for importer, _, _, top in package_imports():
        if top in graph:
            graph[importer].add(top)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles between packages: " + "; ".join(
        " -> ".join(c) for c in cycles
    )


def test_no_study_imports_another() -> None:
    assert all(_is_project_module(study) for study in STUDIES), "a study was renamed: update"
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in package_files("experiments")
        if _module_name(path) in STUDIES
        for line, name in imports_of(path)
        if any(name == s or name.startswith(f"{s}.") for s in STUDIES - {_module_name(path)})
    ]
    assert not bad, "a study may not import another study:\n  " + "\n  ".join(bad)


def test_every_project_import_names_an_existing_module() -> None:
    # After a move (core/rundir.py -> store/rundir.py) an import of the old place fails only
    # when its code runs: inside a function, in a benchmark, in a test that is skipped here.
    roots = [REPO / p for p in packages()] + [REPO / "bench", REPO / "tests"]
    files = [REPO / "cli.py"] + [
        p for root in roots for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts
    ]
    project = set(packages())
    stale = [
        f"{path.relative_to(REPO)}:{line} imports {name}, which does not exist"
        for path in files
        for line, name in imports_of(path)
        if name.split(".")[0] in project and not _is_project_module(name)
    ]
    assert not stale, "\n".join(stale)


# -- the host/image split ------------------------------------------------------------------------


def _generated(path: Path) -> bool:
    rel = str(path.relative_to(REPO))
    return any(fnmatch.fnmatch(rel, pattern) for pattern in GENERATED)


def _normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def image_distributions() -> set[str]:
    """The distributions the images install: images/requirements.txt (normalised names)."""
    lines = (REPO / "images" / "requirements.txt").read_text().splitlines()
    names = (re.split(r"[=<>~!\[ ;]", line.strip(), maxsplit=1)[0] for line in lines)
    return {_normalise(n) for n in names if n and not n.startswith("#")}


def image_import_problems(files: Iterable[tuple[Path, str]]) -> list[str]:
    """What the modules ``files`` ((path, module name) pairs) import that an image lacks: a
    project package other than :data:`IMAGE_PACKAGES`, a :data:`HOST_ONLY` package, or any
    other third-party package whose distribution images/requirements.txt does not install."""
    project = set(packages()) | TOP
    installed = image_distributions()
    distributions = importlib.metadata.packages_distributions()
    problems = []
    for path, module in files:
        for line, name in imports_of(path, module):
            top = name.split(".")[0]
            where = f"{module}:{line} imports {name}"
            if top in sys.stdlib_module_names or top == "__future__" or top in IMAGE_PACKAGES:
                continue
            if top in project:
                problems.append(f"{where}: host side, not in the images")
            elif top in HOST_ONLY:
                problems.append(f"{where}: a host-only package")
            elif not {_normalise(d) for d in distributions.get(top, [top])} & installed:
                problems.append(f"{where}: not installed by images/requirements.txt")
    return problems


def test_the_image_packages_import_only_each_other() -> None:
    for package in sorted(IMAGE_PACKAGES):
        assert ALLOWED[package] <= IMAGE_PACKAGES, f"{package} may not import a host package"


def test_the_images_carry_the_image_packages_whole() -> None:
    # .dockerignore draws the split by package: it lets in core/ and workloads/ and keeps out
    # only their caches and generated files, never one of their modules or data files.
    from images.build import WORKLOAD_DOCKERFILE, context_files

    sent = {rel for rel in context_files() if (REPO / rel).is_file()}
    expected = {
        str(path.relative_to(REPO))
        for package in IMAGE_PACKAGES
        for path in (REPO / package).rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.suffix != ".pyc"
        and not any(part.startswith(".protoc-") for part in path.parts)
        and not _generated(path)
    }
    assert sent - {".dockerignore", WORKLOAD_DOCKERFILE} == expected


def test_the_image_packages_import_nothing_host_only() -> None:
    modules = [
        (path, _module_name(path))
        for package in sorted(IMAGE_PACKAGES)
        for path in package_files(package)
        if not _generated(path)
    ]
    problems = image_import_problems(modules)
    assert not problems, "the workload images would fail to import:\n  " + "\n  ".join(problems)


def test_the_image_rule_sees_host_only_imports(tmp_path: Path) -> None:
    assert not HOST_ONLY & image_distributions(), "the images install a HOST_ONLY package"
    # The run-directory format is host side: it reads and writes with pandas and pyarrow.
    rundir = image_import_problems([(REPO / "store" / "rundir.py", "store.rundir")])
    assert any("imports pandas: a host-only package" in p for p in rundir)
    assert any("imports pyarrow: a host-only package" in p for p in rundir)
    # A module of workloads/ that slips, in each form the scanner reads.
    (tmp_path / "slip.py").write_text(
        "import importlib\n"
        "from store.profiledb import lookup\n"
        "TASK = 'store.rundir:Run'\n"
        "def plot():\n"
        "    import plotly.express\n"
        "    return importlib.import_module('click')\n"
        "import scipy.stats\n"
    )
    problems = image_import_problems([(tmp_path / "slip.py", "workloads.slip")])
    assert sorted(p.partition(" imports ")[2] for p in problems) == [
        "click: a host-only package",
        "plotly.express: a host-only package",
        "scipy.stats: not installed by images/requirements.txt",
        "store.profiledb: host side, not in the images",
        "store.rundir: host side, not in the images",
    ]
