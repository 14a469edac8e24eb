"""The workloads twintrace can run, described as data.

Each :class:`WorkloadSpec` says what a workload is, what data it reads, which options it takes,
how to check a dataset before a container starts and how to run it. Importing this module does
not import torch: ``run`` imports the training code when called, so the host CLI can list
workloads and check data quickly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workloads.config import WorkloadConfig
from workloads.data import DataSummary
from workloads.errors import UserError
from workloads.events import Emitter
from workloads.unet3d import files as unet3d_files
from workloads.unet3d.options import UNet3DOptions



@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """One workload.

    - ``options_type``: frozen dataclass of the workload's own settings (``config.options``).
    - ``check_data(path)``: validate a dataset directory quickly (no full reads); raises
      UserError saying what to do, returns a :class:`DataSummary`.
    - ``run(config, data_dir, out_dir, emitter)``: train; events go to ``emitter``, files such
      as checkpoints under ``out_dir``.
    """

    name: str
    description: str
    data_format: str
    options_type: type
    check_data: Callable[[Path], DataSummary]
    run: Callable[[WorkloadConfig, Path, Path, Emitter], None]

    def parse_options(self, options: Mapping[str, Any]) -> Any:
        """Build ``options_type`` from a config's ``options`` table (unknown keys rejected)."""
        from_dict = getattr(self.options_type, "from_dict", None)
        if from_dict is not None:
            return from_dict(dict(options))
        from workloads.config import from_mapping

        return from_mapping(self.options_type, dict(options), f"{self.name} options")


def _run_unet3d(config: WorkloadConfig, data_dir: Path, out_dir: Path, emitter: Emitter) -> None:
    from workloads.unet3d import train  # imports torch

    train.run(config, data_dir, out_dir, emitter)


WORKLOADS: dict[str, WorkloadSpec] = {
    "unet3d": WorkloadSpec(
        name="unet3d",
        description=(
            "MLCommons UNet3D (KiTS19 3D segmentation): each sample reads a whole image/label "
            "pair with np.load, crops a patch and flips it; PyTorch DataLoader workers, DDP"
        ),
        data_format=unet3d_files.DATA_FORMAT,
        options_type=UNet3DOptions,
        check_data=unet3d_files.check_dataset,
        run=_run_unet3d,
    ),
}


def get_workload(name: str) -> WorkloadSpec:
    """The spec of workload ``name``; a UserError lists the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UserError(
            f"unknown workload {name!r}: choose one of {', '.join(sorted(WORKLOADS))}"
        ) from None
