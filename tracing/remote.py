"""The storage node of a remote image dataset (docs/sophon.md), as a container of the run.

A workload run with ``--set dataset=remote-...`` is a two-role topology: ``storage`` serves the
dataset (``python -m workloads.sophon.server``, the workload's own image with another entry
point, the dataset mounted read-only at /data, a daemon: it runs until training is done) and
``main`` trains on what it serves, reaching it as ``storage:50051`` on the run's private
network; ``main`` gets no dataset mount at all. With ``--storage-host HOST:PORT`` the storage
node is a server started elsewhere (``./cli.py storage-server``): the run has only ``main``,
on docker's default bridge network, which routes out of the host.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from core.errors import SettingError, UserError
from tracing.container import DATA_MOUNT, BindMount
from tracing.request import ContainerSpec
from workloads.images.files import load_image_data
from workloads.images.options import STORAGE_PORT, STORAGE_ROLE


@dataclasses.dataclass(frozen=True)
class StorageNode:
    """The storage container's resources: its preprocessing processes (``--prep-workers``),
    CPU limit (``--storage-cpus``; None: the run's ``--cpus``) and memory limit (None: the
    run's)."""

    prep_workers: int = 1
    cpus: float | None = None
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.prep_workers < 1:
            raise SettingError(
                "{prep_workers} must be at least 1, got {got}", got=self.prep_workers
            )
        if self.cpus is not None and self.cpus <= 0:
            raise SettingError("{storage_cpus} must be positive, got {got}", got=self.cpus)


def check_served_dataset(data_dir: Path) -> None:
    """UserError unless ``data_dir`` is an image dataset the storage node serves (folder
    layout), checked on the host before anything starts."""
    data = load_image_data(data_dir)
    if data.layout != "folder":
        raise UserError(
            f"{data_dir} is a grouped image dataset: a storage node serves the folder layout "
            "(generate one without --group-size)"
        )


def storage_container(
    image: str,
    data_dir: Path,
    node: StorageNode,
    default_cpus: float | None,
    default_memory: int | None,
) -> ContainerSpec:
    """The ``storage`` role: the server over ``data_dir`` in ``image``."""
    return ContainerSpec(
        role=STORAGE_ROLE,
        image=image,
        command=(
            "python",
            "-m",
            "workloads.sophon.server",
            "--data",
            DATA_MOUNT,
            "--port",
            str(STORAGE_PORT),
            "--prep-workers",
            str(node.prep_workers),
        ),
        mounts=(BindMount(Path(data_dir), DATA_MOUNT, True),),
        cpus=node.cpus if node.cpus is not None else default_cpus,
        memory_bytes=node.memory_bytes if node.memory_bytes is not None else default_memory,
        out=False,
        daemon=True,
    )
