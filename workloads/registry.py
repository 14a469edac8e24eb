"""The workloads twintrace can run, described as data.

Each :class:`WorkloadSpec` says what a workload is, what data it reads (and which generator
writes it), which options it takes, its default parameters, how to check a dataset before a
container starts, and which :class:`workloads.training.Task` trains it. Importing this module
does not import torch: ``run`` imports the training code when called, so the host CLI can list
workloads and check data quickly.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.errors import UserError
from workloads.bert import files as bert_files
from workloads.bert.options import BertOptions
from workloads.config import VARIANTS, WorkloadConfig
from workloads.data import DataSummary
from workloads.dlrm import files as dlrm_files
from workloads.dlrm.options import DLRMOptions
from workloads.events import Emitter
from workloads.images import files as image_files
from workloads.images.options import ImageOptions
from workloads.unet3d import files as unet3d_files
from workloads.unet3d.options import UNet3DOptions


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """One workload.

    - ``options_type``: frozen dataclass of the workload's own settings (``config.options``),
      with a ``from_dict`` that rejects unknown keys.
    - ``check_data(path)``: validate a dataset directory quickly (no full reads); raises
      UserError saying what to do, returns a :class:`DataSummary`.
    - ``task``: ``"module:Class"`` of its :class:`workloads.training.Task`, whose
      ``create(config, data_dir)`` validates the options against the data.
    - ``defaults``: WorkloadConfig settings that differ from the generic defaults.
    - ``datagen``: the ``./cli.py datagen`` generator that writes its data.
    """

    name: str
    description: str
    data_format: str
    options_type: type
    check_data: Callable[[Path], DataSummary]
    task: str
    datagen: str
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    variants: tuple[str, ...] = VARIANTS

    def parse_options(self, options: Mapping[str, Any]) -> Any:
        """Build ``options_type`` from a config's ``options`` table (unknown keys rejected)."""
        return self.options_type.from_dict(dict(options))

    def config(self, variant: str, **settings: Any) -> WorkloadConfig:
        """A config of this workload: the generic defaults, then ours, then ``settings``."""
        return WorkloadConfig(workload=self.name, variant=variant, **{**self.defaults, **settings})

    def default_settings(self) -> dict[str, Any]:
        """Every default parameter: WorkloadConfig's with ours applied, and the options'."""
        config = self.config("original").to_dict()
        for key in ("workload", "variant", "options", "profile"):
            config.pop(key)
        return {**config, "options": dataclasses.asdict(self.options_type())}

    def task_of(self, config: WorkloadConfig, data_dir: Path) -> Any:
        """The workload's :class:`workloads.training.Task` for ``config`` over ``data_dir``
        (imports torch and the task's module)."""
        module, _, name = self.task.partition(":")
        task_type = getattr(importlib.import_module(module), name)
        return task_type.create(config, Path(data_dir))

    def run(self, config: WorkloadConfig, data_dir: Path, out_dir: Path, emitter: Emitter) -> None:
        """Train (imports torch and the workload's task)."""
        from workloads import training

        training.run(config, self.task_of(config, data_dir), out_dir, emitter)


_IMAGE_DESCRIPTION = (
    "{model} image classification (torch, no torchvision): JPEGs decoded with Pillow, "
    "RandomResizedCrop, flip, normalise; ImageNet folders or grouped files (one read per group)"
)


def _spec(
    name: str,
    task: str,
    files: Any,
    options_type: type,
    description: str,
    **defaults: Any,
) -> WorkloadSpec:
    """The spec of a workload whose task is ``task`` (``"workloads.<package>.task:Class"``, a
    string the layering test reads): its data format and check from its package's ``files``,
    its data from the generator named as its package."""
    return WorkloadSpec(
        name=name,
        description=description,
        data_format=files.DATA_FORMAT,
        options_type=options_type,
        check_data=files.check_dataset,
        task=task,
        datagen=task.split(".")[1],
        defaults=defaults,
    )


WORKLOADS: dict[str, WorkloadSpec] = {
    "unet3d": _spec(
        "unet3d",
        "workloads.unet3d.task:UNet3DTask",
        unet3d_files,
        UNet3DOptions,
        "MLCommons UNet3D (KiTS19 3D segmentation): each sample reads a whole image/label "
        "pair with np.load, crops a patch and flips it; PyTorch DataLoader workers, DDP",
    ),
    "bert": _spec(
        "bert",
        "workloads.bert.task:BertTask",
        bert_files,
        BertOptions,
        "MLPerf BERT pre-training: transformer encoder with masked-LM and next-sentence "
        "heads; TFRecord shards read interleaved (cycle 8), records parsed as tf.train.Example",
        batch_size=4,
    ),
    "dlrm": _spec(
        "dlrm",
        "workloads.dlrm.task:DLRMTask",
        dlrm_files,
        DLRMOptions,
        "MLPerf DLRM (Criteo Terabyte): embedding tables, bottom/top MLPs, dot interaction; "
        "one contiguous read of batch x 160 bytes per step at a random batch offset",
        batch_size=2048,
    ),
    **{
        model: _spec(
            model,
            "workloads.images.task:ImageTask",
            image_files,
            ImageOptions,
            _IMAGE_DESCRIPTION.format(model=title),
            batch_size=8,
        )
        for model, title in (
            ("resnet18", "ResNet-18"),
            ("resnet50", "ResNet-50"),
            ("alexnet", "AlexNet"),
        )
    },
}


def get_workload(name: str) -> WorkloadSpec:
    """The spec of workload ``name``; a UserError lists the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UserError(
            f"unknown workload {name!r}: choose one of {', '.join(sorted(WORKLOADS))}"
        ) from None
