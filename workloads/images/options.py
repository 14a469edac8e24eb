"""Image-classification settings (the ``options`` table of a resnet18/resnet50/alexnet config)."""

from __future__ import annotations

import dataclasses
from typing import Any

from core.errors import UserError
from workloads.config import from_mapping


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """Settings of the image-classification workloads; unknown keys rejected by :meth:`from_dict`.

    - ``image_size``: edge of the RandomResizedCrop (224 as the ImageNet references; smaller
      sizes make CPU steps shorter without changing the files read).
    - ``width``: channels of the first ResNet stage (64 is the published architecture;
      ignored by AlexNet).
    - ``optimizer`` (``sgd`` with momentum 0.9 as the references, or ``adam``) and
      ``learning_rate``.

    The batch size of grouped datasets must be a multiple of their group size G: each loader
    item is one group file of G images, so a step reads batch_size / G groups.
    """

    image_size: int = 224
    width: int = 64
    optimizer: str = "sgd"
    learning_rate: float = 0.1

    def __post_init__(self) -> None:
        if self.image_size < 8:
            raise UserError(f"image option image_size must be at least 8, got {self.image_size}")
        if self.width < 1:
            raise UserError(f"image option width must be at least 1, got {self.width}")
        if self.optimizer not in ("sgd", "adam"):
            raise UserError(f"image option optimizer must be sgd or adam, got {self.optimizer!r}")
        if self.learning_rate <= 0:
            raise UserError(
                f"image option learning_rate must be positive, got {self.learning_rate}"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageOptions:
        """Build from a config's ``options`` table, rejecting unknown keys by name."""
        return from_mapping(cls, dict(data), "image options")
