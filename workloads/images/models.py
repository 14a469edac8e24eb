"""ResNet-18, ResNet-50 and AlexNet in plain torch, layer for layer as torchvision builds them.

torchvision is not installed in the workload images, so these repeat its architectures: ResNet
v1.5 (the stride of a bottleneck is on its 3x3 convolution), Kaiming-normal (fan_out) conv
weights and BatchNorm weight 1 / bias 0 as torchvision initialises ResNets, and AlexNet with
torch's default initialisation, as torchvision leaves it. At 1000 classes and ``width=64`` the
parameter counts equal torchvision's (11,689,512; 25,557,032; 61,100,840). ``width`` scales
every ResNet stage (``width``, 2x, 4x, 8x) to make a cheaper model of the same shape.

``array_size`` B > 1 builds a horizontally fused array of B such models (HFTA,
:mod:`workloads.images.fused`): grouped convolutions over B x C channels, normalisation over
B x C channels, batched linear layers; it takes ``[N, 3, H, W]`` images and returns
``[N, B, classes]``. At B = 1 every layer is the plain one.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from core.errors import UserError
from workloads.images.fused import FusedLinear, build_array, replicate, split_features


def _conv(
    in_channels: int,
    out_channels: int,
    kernel: int,
    array: int = 1,
    stride: int = 1,
    padding: int = 0,
    bias: bool = True,
) -> nn.Conv2d:
    """A convolution of each of ``array`` models: one grouped convolution over them."""
    return nn.Conv2d(
        in_channels * array,
        out_channels * array,
        kernel,
        stride=stride,
        padding=padding,
        bias=bias,
        groups=array,
    )


def _norm(channels: int, array: int = 1) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels * array)


def _linear(in_features: int, out_features: int, array: int = 1) -> nn.Module:
    if array == 1:
        return nn.Linear(in_features, out_features)
    return FusedLinear(array, in_features, out_features)


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1, array: int = 1) -> nn.Conv2d:
    return _conv(in_channels, out_channels, 3, array, stride=stride, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int, stride: int = 1, array: int = 1) -> nn.Conv2d:
    return _conv(in_channels, out_channels, 1, array, stride=stride, bias=False)


class _Residual(nn.Module):
    """A residual block: ``relu(residual(x) + identity)``, the identity being ``x`` or, where the
    block changes the shape, ``downsample(x)``. A block makes its layers in :meth:`_layers`
    (before ``downsample``, so parameters come in torchvision's order)."""

    expansion: int
    relu: nn.ReLU

    def __init__(
        self,
        in_channels: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
        array: int = 1,
    ) -> None:
        super().__init__()
        self._layers(in_channels, planes, stride, array)
        self.downsample = downsample

    def _layers(self, in_channels: int, planes: int, stride: int, array: int) -> None:
        raise NotImplementedError

    def residual(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(self.residual(x) + identity)


class BasicBlock(_Residual):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def _layers(self, in_channels: int, planes: int, stride: int, array: int) -> None:
        self.conv1 = _conv3x3(in_channels, planes, stride, array)
        self.bn1 = _norm(planes, array)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes, array=array)
        self.bn2 = _norm(planes, array)

    def residual(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.bn2(self.conv2(out))


class Bottleneck(_Residual):
    """1x1 reduce, 3x3 (strided, v1.5), 1x1 expand by 4, with a residual connection."""

    expansion = 4

    def _layers(self, in_channels: int, planes: int, stride: int, array: int) -> None:
        self.conv1 = _conv1x1(in_channels, planes, array=array)
        self.bn1 = _norm(planes, array)
        self.conv2 = _conv3x3(planes, planes, stride, array)
        self.bn2 = _norm(planes, array)
        self.conv3 = _conv1x1(planes, planes * self.expansion, array=array)
        self.bn3 = _norm(planes * self.expansion, array)
        self.relu = nn.ReLU(inplace=True)

    def residual(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))


class ResNet(nn.Module):
    """Stem (7x7/2 conv, max-pool), four stages of residual blocks, global pool, linear."""

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        blocks_per_stage: tuple[int, int, int, int],
        num_classes: int = 1000,
        width: int = 64,
        array_size: int = 1,
    ) -> None:
        super().__init__()
        self.array_size = array_size
        self.in_channels = width
        self.conv1 = _conv(3, width, 7, array_size, stride=2, padding=3, bias=False)
        self.bn1 = _norm(width, array_size)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(block, width, blocks_per_stage[0], stride=1)
        self.layer2 = self._stage(block, width * 2, blocks_per_stage[1], stride=2)
        self.layer3 = self._stage(block, width * 4, blocks_per_stage[2], stride=2)
        self.layer4 = self._stage(block, width * 8, blocks_per_stage[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = _linear(width * 8 * block.expansion, num_classes, array_size)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _stage(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        out_channels = planes * block.expansion
        array = self.array_size
        downsample = None
        if stride != 1 or self.in_channels != out_channels:
            downsample = nn.Sequential(
                _conv1x1(self.in_channels, out_channels, stride, array),
                _norm(out_channels, array),
            )
        layers = [block(self.in_channels, planes, stride, downsample, array)]
        self.in_channels = out_channels
        layers += [block(out_channels, planes, array=array) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = replicate(x, self.array_size)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(split_features(self.avgpool(x).flatten(1), self.array_size))


class AlexNet(nn.Module):
    """torchvision's AlexNet (the one-GPU variant of the paper), 6x6 adaptive pool included."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5, array_size: int = 1) -> None:
        super().__init__()
        self.array_size = a = array_size
        self.features = nn.Sequential(
            _conv(3, 64, 11, a, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            _conv(64, 192, 5, a, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            _conv(192, 384, 3, a, padding=1),
            nn.ReLU(inplace=True),
            _conv(384, 256, 3, a, padding=1),
            nn.ReLU(inplace=True),
            _conv(256, 256, 3, a, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
        )
        # The adaptive pool lets inputs smaller than 224x224 (down to 63x63) reach the classifier.
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(dropout),
            _linear(256 * 6 * 6, 4096, a),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            _linear(4096, 4096, a),
            nn.ReLU(inplace=True),
            _linear(4096, num_classes, a),
        )

    def forward(self, x: Tensor) -> Tensor:
        features = self.avgpool(self.features(replicate(x, self.array_size))).flatten(1)
        return self.classifier(split_features(features, self.array_size))


def _check_sizes(num_classes: int, width: int, array_size: int = 1) -> None:
    if num_classes < 1:
        raise UserError(f"num_classes is {num_classes}: set it to at least 1")
    if width < 1:
        raise UserError(f"ResNet width is {width}: set it to at least 1 (64 is the standard)")
    if array_size < 1:
        raise UserError(f"array_size is {array_size}: set it to at least 1 (1: one model)")


def resnet18(num_classes: int = 1000, width: int = 64, array_size: int = 1) -> ResNet:
    """ResNet-18: basic blocks (2, 2, 2, 2)."""
    _check_sizes(num_classes, width, array_size)
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, width, array_size)


def resnet50(num_classes: int = 1000, width: int = 64, array_size: int = 1) -> ResNet:
    """ResNet-50 (v1.5): bottleneck blocks (3, 4, 6, 3)."""
    _check_sizes(num_classes, width, array_size)
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, width, array_size)


def alexnet(num_classes: int = 1000, array_size: int = 1) -> AlexNet:
    """AlexNet as in torchvision."""
    _check_sizes(num_classes, 1, array_size)
    return AlexNet(num_classes, array_size=array_size)


IMAGE_MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "alexnet": alexnet,
}


def build_image_model(
    name: str, num_classes: int, width: int = 64, array_size: int = 1, seed: int | None = None
) -> nn.Module:
    """The model called ``name`` (one of :data:`IMAGE_MODELS`); ``width`` is for ResNets only.

    ``array_size`` B > 1: a fused array of B such models, each initialised as one model built
    alone after ``torch.manual_seed(seed)`` (:func:`workloads.images.fused.build_array`;
    ``seed`` None: one after the other from the current random state, B different models)."""
    if name not in IMAGE_MODELS:
        raise UserError(
            f"unknown image model {name!r}: choose one of {', '.join(sorted(IMAGE_MODELS))}"
        )
    if name == "alexnet":
        if width != 64:
            raise UserError(
                f"alexnet has fixed widths but width={width} was given: leave width at 64 "
                "or pick resnet18/resnet50"
            )

        def make(b: int) -> nn.Module:
            return alexnet(num_classes, array_size=b)
    else:

        def make(b: int) -> nn.Module:
            return IMAGE_MODELS[name](num_classes, width, array_size=b)

    _check_sizes(num_classes, width, array_size)
    return build_array(make, array_size, seed)
