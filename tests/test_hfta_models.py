"""Fused arrays of image models (HFTA): the array equals B separate models.

With the same initial weights and inputs, the fused array's outputs, losses and the weights
after optimizer steps equal B separate models' (float64: to the last bits or nearly; float32:
outputs and losses within float tolerance). Also the options, the task's sample counts and the
shapes-only (meta) build the sleep variant uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from core.errors import UserError
from workloads.images.fused import (
    FusedAdam,
    FusedLinear,
    FusedSGD,
    array_loss,
    array_optimizer,
    build_array,
    load_array,
    model_state,
    per_model_losses,
)
from workloads.images.models import alexnet, build_image_model, resnet18, resnet50
from workloads.images.options import ImageOptions

B = 3
LEARNING_RATES = [0.1, 0.01, 0.05]

#: Small members of each fused architecture (few classes, narrow ResNets; AlexNet is fixed).
MODELS: dict[str, Callable[[int], nn.Module]] = {
    "resnet18": lambda b: resnet18(5, 8, array_size=b),
    "alexnet": lambda b: alexnet(5, array_size=b),
    "resnet50": lambda b: resnet50(5, 4, array_size=b),
}


@pytest.fixture()
def float64() -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _separate_and_array(
    name: str, seed: int = 0, size: int = B
) -> tuple[list[nn.Module], nn.Module]:
    """``size`` different models (drawn one after the other) and the array holding them."""
    torch.manual_seed(seed)
    make = MODELS[name]
    models = [make(1) for _ in range(size)]
    with torch.device("meta"):
        array = make(size)
    return models, load_array(array.to_empty(device="cpu"), models)


def _inputs(n: int = 6, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, size, size, generator=g, dtype=torch.get_default_dtype())
    return x, torch.arange(n) % 5


def _no_dropout(*modules: nn.Module) -> None:
    """AlexNet's dropout draws differ between one model and an array: train without it."""
    for module in modules:
        for m in module.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0


def _worst_relative(array: nn.Module, models: list[nn.Module]) -> float:
    worst = 0.0
    for b, model in enumerate(models):
        state = model_state(array, b, len(models))
        for key, value in model.state_dict().items():
            ours = state[key].reshape(value.shape).to(torch.float64)
            scale = float(value.abs().max()) or 1.0
            worst = max(worst, float((ours - value.to(torch.float64)).abs().max()) / scale)
    return worst


@pytest.mark.parametrize(
    ("name", "optimizer", "size"),
    [
        ("resnet18", "sgd", B),
        ("resnet18", "adam", B),
        ("resnet50", "sgd", B),
        ("resnet50", "adam", B),
        # AlexNet's 58 M classifier weights make each float64 step seconds long: two models,
        # SGD (the optimizers do not depend on the architecture)
        ("alexnet", "sgd", 2),
    ],
)
def test_the_array_trains_exactly_as_its_separate_models(
    name: str, optimizer: str, size: int, float64: None
) -> None:
    models, array = _separate_and_array(name, size=size)
    _no_dropout(array, *models)
    rates = LEARNING_RATES[:size]
    x, y = _inputs()
    out = array(x)
    assert out.shape == (6, size, 5)
    separate = [m(x) for m in models]
    for b in range(size):
        torch.testing.assert_close(out[:, b], separate[b], rtol=1e-10, atol=1e-12)
    losses = torch.stack([nn.functional.cross_entropy(o, y) for o in separate])
    torch.testing.assert_close(per_model_losses(out, y), losses, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(array_loss(out, y), losses.sum(), rtol=1e-10, atol=1e-12)

    fused = array_optimizer(array.parameters(), optimizer, rates)
    if optimizer == "sgd":
        alone = [
            torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
            for m, lr in zip(models, rates, strict=True)
        ]
    else:
        alone = [
            torch.optim.Adam(m.parameters(), lr=lr) for m, lr in zip(models, rates, strict=True)
        ]
    for _ in range(2):  # two steps: momentum and Adam's moments are used, not just made
        fused.zero_grad()
        array_loss(array(x), y).backward()
        fused.step()
        for model, opt in zip(models, alone, strict=True):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    # Weights and the batch norms' running statistics, model by model.
    assert _worst_relative(array, models) < 1e-9
    # Every model moved from where it started: the check above is not vacuous.
    before = _separate_and_array(name, size=size)[1]
    keys = (
        ("features.0.weight", "classifier.6.weight")
        if name == "alexnet"
        else ("conv1.weight", "fc.weight")
    )
    moved = [
        not torch.equal(model_state(array, b, size)[key], model_state(before, b, size)[key])
        for b in range(size)
        for key in keys
    ]
    assert all(moved)


@pytest.mark.parametrize("name", ["resnet18", "alexnet"])
def test_in_float32_outputs_and_losses_agree_within_float_tolerance(name: str) -> None:
    models, array = _separate_and_array(name, seed=3)
    for m in (array, *models):
        m.eval()  # running statistics and no dropout: a well-conditioned comparison
    x, y = _inputs(n=4, size=96)
    with torch.no_grad():
        out = array(x)
        separate = [m(x) for m in models]
    for b in range(B):
        torch.testing.assert_close(out[:, b], separate[b], rtol=1e-4, atol=1e-5)
    losses = torch.stack([nn.functional.cross_entropy(o, y) for o in separate])
    torch.testing.assert_close(per_model_losses(out, y), losses, rtol=1e-4, atol=1e-5)


def test_fused_linear_is_a_linear_layer_per_model(float64: None) -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(7, 4) for _ in range(B)]
    fused = FusedLinear(B, 7, 4)
    load_array(fused, layers)
    x = torch.randn(5, B, 7)
    out = fused(x)
    for b, layer in enumerate(layers):
        torch.testing.assert_close(out[:, b], layer(x[:, b]))


def test_an_array_built_from_a_seed_holds_b_copies_of_the_seeded_model() -> None:
    array = build_image_model("resnet18", 5, width=8, array_size=B, seed=4)
    torch.manual_seed(4)
    one = build_image_model("resnet18", 5, width=8, seed=4)
    for b in range(B):
        state = model_state(array, b, B)
        for key, value in one.state_dict().items():
            assert torch.equal(state[key].reshape(value.shape), value), (b, key)
    # Without a seed the members are drawn one after the other: all different.
    torch.manual_seed(0)
    drawn = build_image_model("resnet18", 5, width=8, array_size=2)
    first, second = (model_state(drawn, b, 2)["conv1.weight"] for b in range(2))
    assert not torch.equal(first, second)


def test_parameter_counts_are_b_times_one_models() -> None:
    def count(model: nn.Module) -> int:
        return sum(p.numel() for p in model.parameters())

    with torch.device("meta"):  # the sleep variant builds the array's shapes only
        for name in ("resnet18", "resnet50", "alexnet"):
            one = build_image_model(name, 1000, array_size=1, seed=0)
            array = build_image_model(name, 1000, array_size=4, seed=0)
            assert next(array.parameters()).device.type == "meta"
            assert count(array) == 4 * count(one)
    assert count(resnet18()) == 11_689_512  # array_size 1 is torchvision's model, unchanged


def test_the_array_optimizers_refuse_bad_rates_and_parameters() -> None:
    with pytest.raises(UserError, match="positive learning rate"):
        FusedSGD([nn.Parameter(torch.zeros(4))], [0.1, -1.0])
    with pytest.raises(ValueError, match="do not split into 3 models"):
        FusedAdam([nn.Parameter(torch.zeros(4))], [0.1, 0.1, 0.1])
    with pytest.raises(UserError, match="sgd or adam"):
        array_optimizer([nn.Parameter(torch.zeros(4))], "adagrad", [0.1, 0.1])


def test_build_array_of_one_is_the_plain_model() -> None:
    model = build_array(lambda b: resnet18(5, 8, array_size=b), 1, seed=0)
    assert isinstance(model.fc, nn.Linear)


# -- Options and task -------------------------------------------------------------------------


def test_options_give_each_model_its_learning_rate() -> None:
    assert ImageOptions().model_learning_rates == (0.1,)
    assert ImageOptions(array_size=3, learning_rate=0.2).model_learning_rates == (0.2,) * 3
    opts = ImageOptions.from_dict({"array_size": "2", "learning_rates": "0.1,0.02"})
    assert opts.array_size == 2 and opts.model_learning_rates == (0.1, 0.02)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"array_size": 0}, "array_size must be from 1 to 1024"),
        ({"array_size": 2, "learning_rates": "0.1"}, "has 1 values for array_size 2"),
        ({"array_size": 2, "learning_rates": "0.1,x"}, "numbers separated by commas"),
        ({"array_size": 2, "learning_rates": "0.1,0"}, "must all be positive"),
    ],
)
def test_bad_array_options_are_one_line_errors(options: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        ImageOptions.from_dict(options)
    assert "\n" not in str(err.value)


def test_a_fused_task_trains_batch_times_b_samples_with_per_model_rates(tmp_path) -> None:
    from datagen.images import ImageGenParams, generate_images
    from workloads.registry import get_workload

    generate_images(tmp_path, 200_000, seed=0, params=ImageGenParams(mean_kb=16.0, classes=3))
    spec = get_workload("resnet18")
    config = spec.config(
        "original",
        batch_size=4,
        workers=0,
        options={"array_size": 2, "learning_rates": "0.1,0.01", "width": 8, "image_size": 32},
    )
    task = spec.task_of(config, tmp_path)
    model = task.build_model(0)
    optimizer = task.make_optimizer(model.parameters())
    assert isinstance(optimizer, FusedSGD) and optimizer.learning_rates == (0.1, 0.01)
    batch = (torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0]))
    out = task.forward(model, batch)
    assert out.shape == (4, 2, 3)
    assert task.batch_samples(batch) == 4 and task.trained_samples(batch) == 8
    loss = task.loss(out, batch)
    torch.testing.assert_close(loss, per_model_losses(out, batch[1]).sum())
    metrics = task.eval_metrics(out, batch)
    assert set(metrics) == {"loss", "top1", "top5", "loss_models", "top1_models", "top5_models"}
    assert 0 <= metrics["top1"] <= metrics["top5"] == 1  # 3 classes: top-5 holds every label
    hits = (out.argmax(2) == batch[1].unsqueeze(1)).float().mean(0).tolist()
    assert metrics["top1_models"] == hits and metrics["top1"] == pytest.approx(sum(hits) / 2)
    losses = per_model_losses(out, batch[1]).tolist()
    assert metrics["loss_models"] == pytest.approx(losses)
