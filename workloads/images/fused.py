"""Horizontally fused training arrays (HFTA, MLSys 2021): B same-shaped models as one model.

An array of B image models (``array_size`` B of :mod:`workloads.images.models`) trains B
models of one architecture, each with its own hyper-parameters, on the same batches, as one
fused model:

- a convolution of the B models is one grouped convolution over B x C channels (groups = B
  times the layer's own groups): model b owns output channels ``b*C .. (b+1)*C - 1`` and reads
  input channels ``b*C_in ..``; the batch of images enters once and is repeated along the
  channels for the first layer (:func:`replicate`);
- batch normalisation over B x C channels is each model's own normalisation (statistics are
  per channel); ReLU, pooling and the residual additions are per element or per channel;
- a linear layer of the B models is a batched matrix product (:class:`FusedLinear`, weight
  ``[B, out, in]``), its input laid out ``[N, B, in]``; the array's outputs are ``[N, B,
  classes]`` and its loss the sum of the B models' mean losses (:func:`array_loss`), so each
  model's gradient is the one it would get alone;
- one optimizer steps every model, each at its own learning rate (:class:`FusedSGD`,
  :class:`FusedAdam`).

Every parameter and buffer of the array holds model b's values as its b-th contiguous block of
``numel / B`` elements, under the same name as in one model (conv weights ``[B*C_out, ...]``,
norm weights ``[B*C]``, fused linear weights ``[B, out, in]``). :func:`load_array` fills an
array from B separate models and :func:`model_state` takes model b's state back out, which is
what the equivalence tests check: with the same initial weights and inputs, the array's
outputs, losses and one optimizer step's updated weights equal B separate models'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from core.errors import UserError


class FusedLinear(nn.Module):
    """B linear layers as one batched matrix product: ``[N, B, in]`` -> ``[N, B, out]``.

    Initialised as B ``nn.Linear`` layers would be (each model's block drawn as its own layer
    draws it), though an array is normally filled from separate models (:func:`load_array`).
    """

    def __init__(self, array_size: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.array_size = array_size
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(array_size, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(array_size, out_features))
        if self.weight.device.type != "meta":
            for b in range(array_size):
                one = nn.Linear(in_features, out_features, device=self.weight.device)
                with torch.no_grad():
                    self.weight[b].copy_(one.weight)
                    self.bias[b].copy_(one.bias)

    def forward(self, x: Tensor) -> Tensor:
        # [B, N, out] = bias + [B, N, in] @ [B, in, out]
        out = torch.baddbmm(self.bias.unsqueeze(1), x.transpose(0, 1), self.weight.transpose(1, 2))
        return out.transpose(0, 1)

    def extra_repr(self) -> str:
        return f"array_size={self.array_size}, in={self.in_features}, out={self.out_features}"


def replicate(x: Tensor, array_size: int) -> Tensor:
    """The images ``[N, C, H, W]`` as the array's first grouped convolution reads them:
    ``[N, B*C, H, W]``, every model seeing the same images."""
    return x.repeat(1, array_size, 1, 1) if array_size > 1 else x


def split_features(x: Tensor, array_size: int) -> Tensor:
    """Flattened features ``[N, B*F]`` (each model's F features contiguous) as ``[N, B, F]``,
    the layout of :class:`FusedLinear`."""
    return x.unflatten(1, (array_size, -1)) if array_size > 1 else x


def _blocks(tensor: Tensor, array_size: int, name: str) -> Tensor:
    if tensor.numel() % array_size:
        raise ValueError(f"{name}: {tensor.numel()} elements do not split into {array_size} models")
    return tensor.reshape(array_size, -1)


def _shared(name: str) -> bool:
    """A buffer kept once for the whole array (every model has the same value): the number of
    batches a batch norm has seen."""
    return name.endswith("num_batches_tracked")


@torch.no_grad()
def load_array(array: nn.Module, models: Sequence[nn.Module]) -> nn.Module:
    """Copy B separate models' parameters and buffers into ``array`` (block b = model b);
    returns ``array``. The models must be the array's architecture at array size 1."""
    size = len(models)
    states = [m.state_dict() for m in models]
    for name, tensor in array.state_dict().items():
        if _shared(name):
            tensor.copy_(states[0][name])
            continue
        parts = [s[name].reshape(-1) for s in states]
        _blocks(tensor, size, name).copy_(torch.stack(parts))
    return array


def model_state(array: nn.Module, b: int, array_size: int) -> dict[str, Tensor]:
    """Model ``b``'s parameters and buffers in ``array``, flat (``numel / B`` elements each,
    in the order of one model's tensor of that name): reshape to one model's shapes to load."""
    return {
        name: tensor.detach().clone()
        if _shared(name)
        else _blocks(tensor.detach(), array_size, name)[b].clone()
        for name, tensor in array.state_dict().items()
    }


def build_array(
    make: Callable[[int], nn.Module], array_size: int, seed: int | None = None
) -> nn.Module:
    """An array of ``array_size`` models, each initialised as one model built alone would be
    (``make(1)``): after ``torch.manual_seed(seed)`` each, so B copies of the same initial model
    which their own learning rates then train; with ``seed`` None one after the other from the
    current random state (B different models). ``make(B)`` builds the array's shapes; under
    ``torch.device("meta")`` only they are made."""
    if seed is not None:
        torch.manual_seed(seed)
    if array_size == 1:
        return make(1)
    if torch.get_default_device().type == "meta":
        return make(array_size)
    with torch.device("meta"):  # shapes only: every value is copied in below
        array = make(array_size)
    models = []
    for _ in range(array_size):
        if seed is not None:
            torch.manual_seed(seed)
        models.append(make(1))
    return load_array(array.to_empty(device=next(models[0].parameters()).device), models)


def array_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    """The sum over the B models of each one's mean cross-entropy: ``outputs`` ``[N, B, K]``,
    ``targets`` ``[N]``. Each model's gradient is then exactly what its loss alone gives it."""
    n, size, classes = outputs.shape
    per_sample = nn.functional.cross_entropy(
        outputs.reshape(n * size, classes), targets.repeat_interleave(size), reduction="sum"
    )
    return per_sample / n


def per_model_losses(outputs: Tensor, targets: Tensor) -> Tensor:
    """Each model's mean cross-entropy, ``[B]``."""
    n, size, _ = outputs.shape
    return torch.stack([nn.functional.cross_entropy(outputs[:, b], targets) for b in range(size)])


class _ArrayOptimizer(torch.optim.Optimizer):
    """An optimizer over an array's parameters, model b at ``learning_rates[b]``: every
    parameter viewed ``[B, numel / B]`` (model b's block in row b) is moved by its
    :meth:`_direction` times each model's learning rate."""

    def __init__(self, params: Iterable[Any], learning_rates: Sequence[float], **defaults: Any):
        if not learning_rates or any(lr <= 0 for lr in learning_rates):
            raise UserError(
                f"give each model of the array a positive learning rate, got {list(learning_rates)}"
            )
        self.array_size = len(learning_rates)
        self.learning_rates = tuple(float(lr) for lr in learning_rates)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                _blocks(p, self.array_size, "an array parameter")

    def _direction(self, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> Tensor:
        """The step of one parameter at learning rate 1, from its (contiguous) gradient."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                direction = self._direction(p.grad.contiguous(), self.state[p], group)
                rates = torch.tensor(self.learning_rates, dtype=p.dtype, device=p.device)
                p.view(self.array_size, -1).sub_(
                    direction.reshape(self.array_size, -1) * rates.unsqueeze(1)
                )
        return loss


class FusedSGD(_ArrayOptimizer):
    """``torch.optim.SGD(momentum=m)`` (no dampening, no weight decay, not Nesterov) for each
    model of the array at its own learning rate."""

    def __init__(
        self, params: Iterable[Any], learning_rates: Sequence[float], momentum: float = 0.9
    ) -> None:
        super().__init__(params, learning_rates, momentum=momentum)

    def _direction(self, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> Tensor:
        momentum = group["momentum"]
        if momentum == 0:
            return grad
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = grad.clone()
        else:
            buf.mul_(momentum).add_(grad)
        return buf


class FusedAdam(_ArrayOptimizer):
    """``torch.optim.Adam`` (betas (0.9, 0.999), eps 1e-8, no weight decay, not AMSGrad) for
    each model of the array at its own learning rate."""

    def __init__(
        self,
        params: Iterable[Any],
        learning_rates: Sequence[float],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        super().__init__(params, learning_rates, betas=betas, eps=eps)

    def _direction(self, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> Tensor:
        beta1, beta2 = group["betas"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(grad)
            state["exp_avg_sq"] = torch.zeros_like(grad)
        state["step"] += 1
        t = state["step"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias2_sqrt = (1 - beta2**t) ** 0.5
        denom = (exp_avg_sq.sqrt() / bias2_sqrt).add_(group["eps"])
        return exp_avg / denom / (1 - beta1**t)


def array_optimizer(
    params: Iterable[Any], name: str, learning_rates: Sequence[float]
) -> torch.optim.Optimizer:
    """The array's optimizer: ``sgd`` (momentum 0.9, as one model's) or ``adam``, model b at
    ``learning_rates[b]``."""
    if name == "sgd":
        return FusedSGD(params, learning_rates, momentum=0.9)
    if name == "adam":
        return FusedAdam(params, learning_rates)
    raise UserError(f"an array of models trains with sgd or adam, got {name!r}")


__all__ = [
    "FusedAdam",
    "FusedLinear",
    "FusedSGD",
    "array_loss",
    "array_optimizer",
    "build_array",
    "load_array",
    "model_state",
    "per_model_losses",
    "replicate",
    "split_features",
]
