"""Generate docker-compose.yml from the workload registry: one service per workload image.

The committed ``docker-compose.yml`` is this module's output (tests/test_compose.py checks it),
so a workload added to ``workloads/registry.py`` gets its services by running::

    .venv/bin/python -m images.compose            # rewrite docker-compose.yml
    .venv/bin/python -m images.compose --check    # exit 1 if it is out of date

Each service builds what ``./cli.py build`` builds (the same Dockerfile and build arguments,
from :mod:`images.build`), so the two never disagree about what an image is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.atomic import atomic_write_text
from images.build import (
    BASE_TAG,
    REGISTRY_BASE,
    REPO,
    image_matrix,
    workload_build_args,
    workload_dockerfile,
)
from workloads.config import image_tag

COMPOSE_FILE = REPO / "docker-compose.yml"

_HEADER = f"""\
# twintrace images as compose services, for users who prefer compose to ./cli.py.
# Generated from workloads/registry.py by `.venv/bin/python -m images.compose`: do not edit.
# Run `./cli.py build` once first: it prepares .cache/base-context (the wheelhouse) and, without
# a registry, the local OS image twintrace/os:bookworm (then set BASE_IMAGE=twintrace/os:bookworm).
#
#   DATA=/path/to/dataset OUT=/path/to/out CONFIG_DIR=/path/with/config.json \\
#     docker-compose run --rm --no-deps unet3d-sleep
#
# (`docker compose` works the same where the v2 plugin is installed.) CONFIG_DIR must hold
# config.json (a workloads/config.py WorkloadConfig as JSON) and may hold profile.json for the
# sleep variant. Compose runs are not traced; use ./cli.py trace for that.
x-workload: &workload
  volumes:
    - ${{DATA:-./data}}:/data:ro
    - ${{OUT:-./out}}:/twintrace/out
    - ${{CONFIG_DIR:-./config}}:/twintrace/ctl:ro
  shm_size: 1g
  # Builds twintrace/base first (`docker-compose build`); --no-deps keeps `run` from starting it.
  depends_on: [base]

services:
  base:
    image: {BASE_TAG}
    build:
      context: .cache/base-context
      dockerfile: ../../Dockerfile.base
      args:
        BASE_IMAGE: ${{BASE_IMAGE:-{REGISTRY_BASE}}}
    command: ["python", "-c", "import torch; print(torch.__version__)"]
"""


def _flow(mapping: dict[str, str]) -> str:
    """A YAML flow mapping of plain scalars (names, tags and paths of this project)."""
    return "{" + ", ".join(f"{key}: {value}" for key, value in mapping.items()) + "}"


def render() -> str:
    """The text of docker-compose.yml for the current registry."""
    parts = [_HEADER]
    for workload, variant in image_matrix():
        parts.append(
            f"\n  {workload}-{variant}:\n"
            "    <<: *workload\n"
            f"    image: {image_tag(workload, variant)}\n"
            "    build:\n"
            "      context: .\n"
            f"      dockerfile: {workload_dockerfile(workload)}\n"
            f"      args: {_flow(workload_build_args(workload, variant))}\n"
        )
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m images.compose",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    parser.add_argument("--out", type=Path, default=COMPOSE_FILE, help="file to write or check")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date: run `.venv/bin/python -m images.compose`")
            return 1
        return 0
    atomic_write_text(args.out, text)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
