"""Image-classification settings (the ``options`` table of a resnet18/resnet50/alexnet config)."""

from __future__ import annotations

import dataclasses

from core.errors import UserError
from workloads.config import WorkloadOptions, check_optimizer

#: ``dataset`` values: the local files, or a storage node's samples (workloads.sophon).
DATASET_MODES = ("local", "remote-nooff", "remote-alloff", "remote-partial", "remote-sophon")
#: The storage node of a traced run: its role (its name on the run's network) and port.
STORAGE_ROLE = "storage"
STORAGE_PORT = 50051


@dataclasses.dataclass(frozen=True)
class ImageOptions(WorkloadOptions):
    """Settings of the image-classification workloads; unknown keys rejected by :meth:`from_dict`.

    - ``image_size``: edge of the RandomResizedCrop (224 as the ImageNet references; smaller
      sizes make CPU steps shorter without changing the files read).
    - ``width``: channels of the first ResNet stage (64 is the published architecture;
      ignored by AlexNet).
    - ``optimizer`` (``sgd`` with momentum 0.9 as the references, or ``adam``) and
      ``learning_rate``.
    - ``array_size``: B > 1 trains a horizontally fused array of B models of the workload's
      architecture on the same batches (HFTA, docs/hfta.md, :mod:`workloads.images.fused`);
      ``learning_rates``: each model's learning rate, B numbers separated by commas (default:
      every model at ``learning_rate``). A step then trains batch x B samples.

    - ``dataset``: ``local`` (the files under ``--data``) or a remote mode, the samples served
      by a storage node over gRPC (docs/sophon.md): ``remote-nooff`` (raw files, all the
      preprocessing here), ``remote-alloff`` (normalised tensors), ``remote-partial`` (decoded,
      cropped and flipped RGB) or ``remote-sophon`` (SOPHON's per-sample choice).
    - ``storage_host``: ``HOST:PORT`` of the storage node of a remote mode (default: the
      ``storage`` container of the run).

    The batch size of grouped datasets must be a multiple of their group size G: each loader
    item is one group file of G images, so a step reads batch_size / G groups.
    """

    TABLE = "image options"

    image_size: int = 224
    width: int = 64
    optimizer: str = "sgd"
    learning_rate: float = 0.1
    array_size: int = 1
    learning_rates: str = ""
    dataset: str = "local"
    storage_host: str = f"{STORAGE_ROLE}:{STORAGE_PORT}"

    def __post_init__(self) -> None:
        if self.image_size < 8:
            raise UserError(f"image option image_size must be at least 8, got {self.image_size}")
        if self.width < 1:
            raise UserError(f"image option width must be at least 1, got {self.width}")
        check_optimizer("image option", self.optimizer, self.learning_rate, ("sgd", "adam"))
        if not 1 <= self.array_size <= 1024:
            raise UserError(
                f"image option array_size must be from 1 to 1024 (models in the fused array), "
                f"got {self.array_size}"
            )
        rates = self.model_learning_rates  # checks learning_rates
        if len(rates) != self.array_size:
            raise UserError(
                f"image option learning_rates has {len(rates)} values for array_size "
                f"{self.array_size}: give one learning rate per model, e.g. "
                f"learning_rates={','.join(['0.1'] * self.array_size)}"
            )
        if self.dataset not in DATASET_MODES:
            raise UserError(
                f"image option dataset must be one of {', '.join(DATASET_MODES)}, "
                f"got {self.dataset!r}"
            )
        host, sep, port = self.storage_host.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(
                f"image option storage_host must be HOST:PORT (e.g. storage:{STORAGE_PORT}), "
                f"got {self.storage_host!r}"
            )

    @property
    def model_learning_rates(self) -> tuple[float, ...]:
        """Each model's learning rate: ``learning_rates`` or, when empty, ``learning_rate`` for
        every model of the array."""
        if not self.learning_rates.strip():
            return (self.learning_rate,) * self.array_size
        try:
            rates = tuple(float(v) for v in self.learning_rates.split(","))
        except ValueError:
            raise UserError(
                f"image option learning_rates must be numbers separated by commas, e.g. "
                f"0.1,0.05, got {self.learning_rates!r}"
            ) from None
        if any(not r > 0 for r in rates):
            raise UserError(
                f"image option learning_rates must all be positive, got {self.learning_rates!r}"
            )
        return rates

    @property
    def remote(self) -> bool:
        """Whether the samples come from a storage node."""
        return self.dataset != "local"
