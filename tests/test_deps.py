"""Declared dependencies match the code: every third-party module the project imports comes
from a distribution declared in pyproject.toml and pinned in requirements.lock, and the lock
holds nothing that no declared dependency needs.

Modules are mapped to distributions with the installed metadata of the test environment
(``importlib.metadata.packages_distributions``), so ``PIL`` is ``pillow`` and ``pynvml`` is
``nvidia-ml-py``. Imports are read with ast, inside functions too.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterable
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "core",
    "workloads",
    "store",
    "datagen",
    "tracing",
    "analysis",
    "images",
    "experiments",
    "commands",
)
PROJECT = frozenset({*PACKAGES, "cli", "bench", "tests"})

#: Declared dependencies that no module imports by their own name, and why they are declared.
DECLARED_WITHOUT_IMPORT = {
    "protobuf": "tfrecord.example_pb2 is protobuf-generated; workloads/bert/records.py uses "
    "protobuf's message API and errors on it",
}


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(text: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
    assert match, text
    return normalise(match.group(1))


@cache
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def extras() -> list[str]:
    """The optional-dependency groups of pyproject.toml (``test``, ``bench``)."""
    return list(pyproject()["project"].get("optional-dependencies", {}))


def declared(groups: Iterable[str] = ()) -> dict[str, str]:
    """Normalised name -> requirement text of [project.dependencies] and the given extras."""
    project = pyproject()["project"]
    texts = list(project["dependencies"])
    for group in groups:
        texts += project["optional-dependencies"][group]
    return {_requirement_name(t): t for t in texts}


def pins(path: Path) -> dict[str, str]:
    """Normalised name -> version of every ``name==version`` line of a requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"{path.name}: {line!r} is not pinned with =="
            out[normalise(name)] = version.strip()
    return out


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    assert match, version
    return tuple(int(part) for part in match.group(1).split("."))


def satisfies(version: str, requirement: str) -> bool:
    """``version`` meets ``requirement``'s ``>=`` / ``==`` / ``<`` bounds (the forms we use)."""
    ok = True
    for op, bound in re.findall(r"(>=|==|<)\s*([0-9][0-9A-Za-z.+]*)", requirement):
        have, want = _release(version), _release(bound)
        if op == ">=":
            ok &= have >= want
        elif op == "<":
            ok &= have < want
        else:
            ok &= version.split("+")[0] == bound
    return ok


def third_party_imports(paths: Iterable[Path]) -> dict[str, set[str]]:
    """Top-level third-party module -> files (relative) importing it."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    found: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top not in PROJECT:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def python_files(*roots: str) -> list[Path]:
    files = []
    for root in roots:
        path = REPO / root
        if path.suffix == ".py":
            files.append(path)
        else:
            files += [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files)


@cache
def _module_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    return {normalise(d) for d in _module_distributions().get(module, [])}


def _check_imports(files: list[Path], allowed: dict[str, str], where: str) -> None:
    problems = []
    for module, importers in sorted(third_party_imports(files).items()):
        dists = distributions_of(module)
        files_text = ", ".join(sorted(importers)[:3])
        if not dists:
            problems.append(
                f"{module} (imported by {files_text}) is not installed: add its distribution "
                f"to {where} and requirements.lock, then `make venv`"
            )
        elif not dists & set(allowed):
            problems.append(
                f"{module} (imported by {files_text}) comes from {', '.join(sorted(dists))}, "
                f"which is not declared in {where}"
            )
    assert not problems, "\n".join(problems)


#: Scripts that run inside an image build, not on the host: checked against their image's pins.
IMAGE_BUILD_SCRIPTS = ("images/dlio/",)


def host_files() -> list[Path]:
    files = python_files(*PACKAGES, "cli.py")
    return [p for p in files if not str(p.relative_to(REPO)).startswith(IMAGE_BUILD_SCRIPTS)]


def test_the_project_declares_every_module_it_imports() -> None:
    _check_imports(host_files(), declared(), "pyproject.toml [project.dependencies]")


def test_the_dlio_image_pins_what_its_build_step_imports() -> None:
    pinned = pins(REPO / "images" / "requirements-dlio.txt")
    modules = third_party_imports(python_files("images/dlio"))
    assert modules, "images/dlio/ has no build-step script importing DLIO"
    for module in modules:
        assert normalise(module) in {normalise(n) for n in pinned}, (
            f"{module} (imported by images/dlio/) is not pinned in images/requirements-dlio.txt"
        )


def test_tests_and_benchmarks_use_declared_modules() -> None:
    # tests/tfref runs under its own virtualenv (.venv-tf, with tensorflow): not ours.
    files = [p for p in python_files("tests", "bench") if "tfref" not in p.parts]
    _check_imports(files, declared(extras()), "pyproject.toml (dependencies or an extra)")


def test_every_declared_dependency_is_imported() -> None:
    files = host_files()
    imported = set()
    for module in third_party_imports(files):
        imported |= distributions_of(module)
    unused = set(declared()) - imported - set(DECLARED_WITHOUT_IMPORT)
    assert not unused, f"declared in pyproject.toml but imported nowhere: {sorted(unused)}"


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    locked = pins(REPO / "requirements.lock")
    for name, requirement in declared(extras()).items():
        assert name in locked, (
            f"{name} is declared in pyproject.toml but not pinned in requirements.lock"
        )
        assert satisfies(locked[name], requirement), (
            f"requirements.lock pins {name}=={locked[name]}, outside pyproject.toml's {requirement!r}"
        )


def _requires(name: str) -> list[str]:
    try:
        requirements = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return []  # a platform-only dependency (pywin32) that is not installed here
    return [_requirement_name(r) for r in requirements if "extra ==" not in r.replace('"', "'")]


def test_the_lock_holds_only_what_the_declared_dependencies_need() -> None:
    # The transitive closure of the declared dependencies over the installed metadata; a pin
    # outside it is a leftover that `make setup` would install for nothing.
    needed: set[str] = set()
    todo = list(declared(extras()))
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += _requires(name)
    extra = sorted(set(pins(REPO / "requirements.lock")) - needed)
    assert not extra, f"requirements.lock pins packages no declared dependency needs: {extra}"


def _image_modules() -> list[Path]:
    """core/ and workloads/: what the images carry, whole (tests/test_layering.py)."""
    return python_files("core", "workloads")


def test_the_images_pin_what_the_workloads_import() -> None:
    # The workloads run inside twintrace/base, whose Python packages come from
    # images/requirements.txt (installed with --no-deps): each module they import needs its
    # own pin there, at the version of requirements.lock.
    image_pins = pins(REPO / "images" / "requirements.txt")
    _check_imports(_image_modules(), image_pins, "images/requirements.txt")
    locked = pins(REPO / "requirements.lock")
    differ = {
        name: (version, locked[name])
        for name, version in image_pins.items()
        if name in locked and version != locked[name]
    }
    assert not differ, f"images/requirements.txt and requirements.lock disagree: {differ}"


@pytest.mark.parametrize(
    "version,requirement,ok",
    [
        ("2.13.0+cpu", "torch==2.13.0", True),
        ("1.17.1", "scipy>=1.13", True),
        ("1.9", "scipy>=1.13", False),
        ("2.9.post0", "crc32c>=2.4", True),
        ("3.0", "x>=2,<3", False),
    ],
)
def test_version_check(version: str, requirement: str, ok: bool) -> None:
    assert satisfies(version, requirement) is ok
