"""The workload images' inputs: their build context is what docker sends for it (the packages
workloads/ and core/, whole), its hash changes with everything that goes into an image and with
nothing else, and every module in it imports only what an image has. No Docker engine needed."""

from __future__ import annotations

import ast
import importlib.metadata
import io
import re
import shutil
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from docker.api.build import process_dockerfile
from docker.utils.build import tar

from images import build as images_build
from images.build import (
    HASH_LABEL,
    WORKLOAD_DOCKERFILE,
    context_files,
    context_hash,
    dockerignore_patterns,
    image_matrix,
    workload_dockerfile,
    workload_inputs_hash,
)
from tests.conftest import REPO
from workloads.config import VARIANTS
from workloads.registry import WORKLOADS

BASE_ID = "sha256:" + "0" * 64

# Top-level entries of the repository not copied into the temporary checkouts (large or caches).
_NOT_COPIED = {
    ".git",
    ".venv",
    ".venv-tf",
    ".cache",
    "data",
    "runs",
    ".ruff_cache",
    ".pytest_cache",
}


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """A copy of the working tree whose files a test may change."""
    root = tmp_path / "repo"
    shutil.copytree(
        REPO,
        root,
        symlinks=True,
        ignore=lambda d, names: _NOT_COPIED & set(names) if Path(d) == REPO else set(),
    )
    return root


def _hashes(root: Path) -> dict[tuple[str, str], str]:
    return {(w, v): workload_inputs_hash(w, v, BASE_ID, root) for w, v in image_matrix()}


def _append(path: Path, text: str = "\n# changed\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(text)


def test_the_images_are_every_registry_workload_in_every_variant() -> None:
    matrix = image_matrix()
    assert matrix == [(w, v) for w in WORKLOADS for v in WORKLOADS[w].variants]
    assert len(matrix) == len(WORKLOADS) * len(VARIANTS) == 18
    # None needs its own Dockerfile today: one for all.
    assert {workload_dockerfile(w) for w in WORKLOADS} == {WORKLOAD_DOCKERFILE}
    own = {p.parent.name for p in (REPO / "images").glob("*/Dockerfile")}
    assert own == {"dlio"}  # the DLIO image's, not a workload's (images/dlio/)
    assert not own & set(WORKLOADS)


def test_context_is_workloads_and_core_without_host_only_modules() -> None:
    files = set(context_files())
    for name in ("__init__.py", "errors.py", "units.py", "atomic.py"):
        assert f"core/{name}" in files
    assert {"workloads/__init__.py", "workloads/__main__.py", "workloads/registry.py"} <= files
    assert WORKLOAD_DOCKERFILE in files  # docker always sends the Dockerfile
    assert "store/rundir.py" not in files
    tops = {f.split("/")[0] for f in files}
    assert tops == {"core", "workloads", "images", ".dockerignore"}
    assert [f for f in files if f.startswith("images/")] == [WORKLOAD_DOCKERFILE]
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]


def test_context_files_are_what_the_docker_sdk_sends() -> None:
    """The same tar ``APIClient.build(path=REPO, dockerfile=...)`` makes (no daemon involved)."""
    dockerfile = process_dockerfile(WORKLOAD_DOCKERFILE, str(REPO))
    archive = tar(str(REPO), exclude=dockerignore_patterns(REPO), dockerfile=dockerfile)
    with tarfile.open(fileobj=io.BytesIO(archive.read())) as sent:
        names = {m.name for m in sent.getmembers()}
    assert names == set(context_files())


@pytest.mark.parametrize(
    "edit",
    [
        "tracing/runner.py",
        "tracing/new_module.py",
        "analysis/timeline.py",
        "datagen/new_module.py",
        "experiments/new_module.py",
        "store/rundir.py",
        "cli.py",
        "README.md",
        "docker-compose.yml",
        "images/build.py",
        "images/requirements.txt",  # the base image's input, whose id the hash covers
        "tests/test_images.py",
        "workloads/__pycache__/registry.cpython-311.pyc",
        "core/__pycache__/errors.cpython-311.pyc",
    ],
)
def test_host_only_changes_rebuild_no_image(checkout: Path, edit: str) -> None:
    before = _hashes(checkout)
    _append(checkout / edit)
    assert _hashes(checkout) == before


@pytest.mark.parametrize(
    "edit",
    [
        "workloads/registry.py",
        "workloads/unet3d/task.py",
        "workloads/new_module.py",
        "workloads/profiles/new.json",
        "core/errors.py",
        "core/units.py",
        "core/__init__.py",
        "core/new_module.py",
        WORKLOAD_DOCKERFILE,
    ],
)
def test_changes_to_what_goes_into_the_images_rebuild_them_all(checkout: Path, edit: str) -> None:
    before = _hashes(checkout)
    _append(checkout / edit)
    after = _hashes(checkout)
    assert all(after[key] != before[key] for key in before)


def test_a_permission_change_rebuilds(checkout: Path) -> None:
    before = _hashes(checkout)
    (checkout / "workloads" / "registry.py").chmod(0o755)
    assert _hashes(checkout)[("dlrm", "sleep")] != before[("dlrm", "sleep")]


def test_each_image_has_its_own_hash() -> None:
    hashes = _hashes(REPO)
    assert len(set(hashes.values())) == len(hashes)
    other_base = workload_inputs_hash("unet3d", "sleep", "sha256:" + "1" * 64)
    assert other_base != hashes[("unet3d", "sleep")]


def test_a_workload_with_its_own_dockerfile_builds_from_it(checkout: Path) -> None:
    before = _hashes(checkout)
    own = checkout / "images" / "bert" / "Dockerfile"
    own.parent.mkdir()
    shutil.copyfile(checkout / WORKLOAD_DOCKERFILE, own)
    assert workload_dockerfile("bert", checkout) == "images/bert/Dockerfile"
    assert "images/bert/Dockerfile" in context_files(checkout, "images/bert/Dockerfile")
    after = _hashes(checkout)
    assert [k for k in before if after[k] != before[k]] == [("bert", v) for v in VARIANTS]
    # Another workload's Dockerfile is not in this one's context.
    assert context_hash(checkout) == context_hash(checkout, WORKLOAD_DOCKERFILE)
    assert "images/bert/Dockerfile" not in context_files(checkout)


class _FakeImages:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    def get(self, tag: str) -> SimpleNamespace:
        return SimpleNamespace(id=f"sha256:{tag}", labels=self.labels)


def test_an_image_whose_label_matches_is_not_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = workload_inputs_hash("dlrm", "sleep", BASE_ID)
    calls: list[dict] = []
    monkeypatch.setattr(images_build, "_stream_build", lambda cli, log, **kw: calls.append(kw))
    fake = SimpleNamespace(images=_FakeImages({HASH_LABEL: inputs}))
    result = images_build.build_workload(fake, "dlrm", "sleep", BASE_ID, print)
    assert not result.built and calls == []

    fake = SimpleNamespace(images=_FakeImages({HASH_LABEL: "stale"}))
    result = images_build.build_workload(fake, "dlrm", "sleep", BASE_ID, print)
    assert result.built
    (call,) = calls
    assert call["path"] == str(images_build.REPO)
    assert call["dockerfile"] == WORKLOAD_DOCKERFILE
    assert call["buildargs"]["WORKLOAD"] == "dlrm" and call["buildargs"]["VARIANT"] == "sleep"
    assert call["labels"] == {HASH_LABEL: inputs}


# -- what the modules in an image may import ---------------------------------------------------

_TASK_STRING = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+):[A-Za-z_]\w*$")


def _requirements() -> set[str]:
    lines = (REPO / "images" / "requirements.txt").read_text().splitlines()
    names = (re.split(r"[=<>~!\[ ;]", line.strip(), maxsplit=1)[0] for line in lines)
    return {_normalise(n) for n in names if n and not n.startswith("#")}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports(path: Path, module: str) -> list[str]:
    """Absolute names of the modules ``path`` imports (anywhere in it) or names as tasks."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".")
                base = package[: len(package) - node.level + (path.name == "__init__.py")]
                names.append(".".join(base + ([node.module] if node.module else [])))
            else:
                names.append(node.module or "")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _TASK_STRING.match(node.value)
            if match and match.group(1).split(".")[0] in ("core", "workloads"):
                names.append(match.group(1))
    return names


def _import_problems(files: set[str]) -> list[str]:
    """What the modules among ``files`` import that an image with only ``files`` lacks."""
    wanted = _requirements()
    distributions = importlib.metadata.packages_distributions()
    problems = []
    for rel in sorted(f for f in files if f.endswith(".py")):
        parts = rel[: -len(".py")].split("/")
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for name in _imports(REPO / rel, module):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if top in ("core", "workloads"):
                path = name.replace(".", "/")
                if f"{path}.py" not in files and f"{path}/__init__.py" not in files:
                    problems.append(f"{rel} imports {name}, which is not in the image")
            elif not {_normalise(d) for d in distributions.get(top, [top])} & wanted:
                problems.append(f"{rel} imports {name}: not in images/requirements.txt")
    return problems


def test_modules_in_the_images_import_only_what_the_images_have() -> None:
    problems = _import_problems(set(context_files()))
    assert not problems, "\n".join(problems)


def test_the_import_check_sees_a_host_only_module() -> None:
    files = set(context_files())
    assert any(
        "store/rundir.py imports pandas" in p for p in _import_problems(files | {"store/rundir.py"})
    )
    problems = _import_problems(files - {"core/units.py"})
    assert problems and all("core.units, which is not in the image" in p for p in problems)
