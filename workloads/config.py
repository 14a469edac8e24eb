"""Typed workload configuration shared by the host (CLI, tracer) and the container entry point.

A :class:`WorkloadConfig` holds the parameters every workload understands; each workload adds
its own frozen options dataclass (for UNet3D: patch size, channel widths, ...) stored under
``options``. Both reject unknown keys by name, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from core.errors import UserError

VARIANTS: tuple[str, ...] = ("original", "instrumented", "sleep")
#: Variants run by a peer tool's image instead of the workload's (workloads/dlio.py): a run
#: config may name them, no workload image exists for them.
PEER_VARIANTS: tuple[str, ...] = ("dlio",)
RUN_VARIANTS: tuple[str, ...] = (*VARIANTS, *PEER_VARIANTS)

#: Environment variables that tell a rank container (``rank`` set) where rank 0 listens.
MASTER_ADDR_ENV = "TWINTRACE_MASTER_ADDR"
MASTER_PORT_ENV = "TWINTRACE_MASTER_PORT"
DEFAULT_MASTER_PORT = 29500
#: The names of every rank container, comma-separated: a rank waits until it can reach each
#: before it joins the process group (workloads.training.wait_for_peers).
PEERS_ENV = "TWINTRACE_PEERS"


#: The image every workload image is built on (Python, torch and the readers' packages).
BASE_TAG = "twintrace/base:latest"
#: The tracer's image: bpftrace, Python and the agent (tracing/agent.py), beside the traced containers.
TRACER_IMAGE = "twintrace/tracer:latest"
#: Its label: the version of the bpftrace it carries.
BPFTRACE_LABEL = "org.twintrace.bpftrace"
#: A node of the virtual cluster (tracing/cluster.py): Debian's Docker engine and registry.
NODE_IMAGE = "twintrace/node:latest"


def image_tag(workload: str, variant: str) -> str:
    """The image of a workload variant: ``twintrace/<workload>:<variant>``."""
    return f"twintrace/{workload}:{variant}"


T = TypeVar("T")


def from_mapping(cls: type[T], data: dict[str, Any], where: str) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and checking simple types."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a table of settings, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(
            f"{where}: unknown setting {unknown[0]!r}; known settings: {', '.join(sorted(fields))}"
        )
    values: dict[str, Any] = {}
    for name, value in data.items():
        default = fields[name].default
        if default is not dataclasses.MISSING and default is not None and value is not None:
            value = _coerce(value, type(default), f"{where}: {name}")
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:  # a required field is missing
        raise UserError(f"{where}: {exc}") from None


class WorkloadOptions:
    """Base of a workload's options, a frozen dataclass (the ``options`` table of its config):
    :meth:`from_dict` builds them, rejecting unknown keys by name; ``TABLE`` names the table in
    its messages (``"bert options"``)."""

    TABLE: ClassVar[str] = "workload options"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build from a config's ``options`` table, rejecting unknown keys by name."""
        return from_mapping(cls, dict(data), cls.TABLE)


def check_fraction(where: str, value: float) -> None:
    """``value`` strictly between 0 and 1; ``where`` names it (``"bert option eval_fraction"``)."""
    if not 0.0 < value < 1.0:
        raise UserError(f"{where} must be in (0, 1), got {value}")


def check_optimizer(
    where: str, optimizer: str, learning_rate: float, known: tuple[str, ...]
) -> None:
    """The settings every workload's options carry: ``optimizer`` one of ``known`` and a
    positive ``learning_rate``; ``where`` begins the message (``"bert option"``)."""
    if optimizer not in known:
        choices = f"{', '.join(known[:-1])} or {known[-1]}" if len(known) > 1 else known[0]
        raise UserError(f"{where} optimizer must be {choices}, got {optimizer!r}")
    if learning_rate <= 0:
        raise UserError(f"{where} learning_rate must be positive, got {learning_rate}")


def _coerce(value: Any, kind: type, where: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise UserError(f"{where}: expected true or false, got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise UserError(f"{where}: expected a number, got {value!r}")
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise UserError(f"{where}: expected {kind.__name__}, got {value!r}") from None
        if kind is int and float(value) != number:
            raise UserError(f"{where}: expected a whole number, got {value!r}")
        return number
    if kind is str:
        return str(value)
    return value


#: With ``epoch_barrier``: after epoch E (not the last) rank R writes ``ended-E-R`` into this
#: folder of its output directory, then waits for ``go-E`` there; the coordinator
#: (tracing/runner.py) writes ``go-E`` into every container's folder once all the run's ranks
#: have ended epoch E, after evicting the dataset from the page cache.
EPOCH_BARRIER_DIR = "epochs"
#: How long a rank waits at the barrier before it fails the run.
EPOCH_BARRIER_WAIT_S = 600.0


def epoch_ended_prefix(epoch: int) -> str:
    """What the names of every rank's file for ``epoch`` start with."""
    return f"ended-{epoch}-"


def epoch_ended_name(epoch: int, rank: int) -> str:
    return f"{epoch_ended_prefix(epoch)}{rank}"


def epoch_go_name(epoch: int) -> str:
    return f"go-{epoch}"


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    """Parameters common to every workload run.

    ``options`` holds the workload's own settings (validated by the workload); ``profile`` is
    the path, inside the container, of a sleep profile file (None: the workload's default).

    ``synthetic``: feed the model data already in memory (DS-Analyzer's first run, the
    accelerators' maximum ingestion rate): one real batch is loaded while the run starts up
    (``init``) and then given to every step, so the epochs read and decode nothing; an epoch has
    as many steps as the real data would give it (``max_steps`` still caps them).

    ``threads``: torch's compute threads per rank; 0 shares the CPUs the process may use among
    its ranks. Jobs sharing a host with others (the HFTA study's concurrent jobs) take their
    share of its cores instead of each starting a thread per core.
    """

    workload: str
    variant: str
    epochs: int = 1
    batch_size: int = 2
    workers: int = 2
    accelerators: int = 1
    seed: int = 0
    max_steps: int = 0  # per epoch; 0 means the whole dataset
    eval_every: int = 0  # evaluate every N epochs; 0 disables evaluation
    checkpoint_every: int = 1  # checkpoint every N epochs; 0 disables checkpoints
    device: str = "auto"  # auto, cpu or cuda (original and instrumented variants)
    synthetic: bool = False  # one in-memory batch for every step (no reads, no decode)
    threads: int = 0  # torch compute threads per rank; 0: the CPUs shared among the ranks
    profile: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # One container per rank: this process runs only rank ``rank`` of ``accelerators`` and
    # joins the others through torch.distributed at TWINTRACE_MASTER_ADDR:TWINTRACE_MASTER_PORT
    # (environment). None: this process runs every rank itself.
    rank: int | None = None
    # Between two epochs every rank waits for the coordinator (:data:`EPOCH_BARRIER_DIR`), which
    # evicts the dataset from the page cache meanwhile: every epoch reads its storage.
    epoch_barrier: bool = False

    def __post_init__(self) -> None:
        if self.variant not in RUN_VARIANTS:
            raise UserError(
                f"unknown variant {self.variant!r}: choose one of {', '.join(RUN_VARIANTS)}"
            )
        for name in ("epochs", "batch_size", "accelerators"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("workers", "max_steps", "eval_every", "checkpoint_every", "threads"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.rank is not None and not 0 <= self.rank < self.accelerators:
            raise UserError(
                f"rank {self.rank} is outside 0..{self.accelerators - 1} "
                f"({self.accelerators} accelerators)"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserError(f"device must be auto, cpu or cuda, got {self.device!r}")

    def replace(self, **changes: Any) -> WorkloadConfig:
        """Return a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "workload config") -> WorkloadConfig:
        return from_mapping(cls, data, where)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> WorkloadConfig:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"config file {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"config file {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data, where=str(path))
