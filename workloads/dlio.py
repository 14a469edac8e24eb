"""The DLIO benchmark as a peer of the zoo's workloads: what its configuration must say to
emulate one of our runs (pure functions, no torch, no docker).

DLIO (argonne-lcf/dlio_benchmark, the engine of MLPerf Storage) emulates a training job's I/O
from a YAML description: a dataset it generates itself (``dataset``: format, files, samples per
file, sample size), a reader (``reader``: loader, batch size, reader threads), a computation time
per step (``train``), checkpoints and the number of ranks (MPI). Two functions derive them from
ours:

- :func:`dataset_spec`: the dataset DLIO's generator must write to stand for one of ours, from our
  dataset's manifest (file count and sizes measured there, record format mapped to the nearest
  one DLIO reads without TensorFlow; what it cannot express is said in ``substitutions``);
- :func:`workload_config`: the ``workload`` section of DLIO's configuration for a run of ours:
  batch size, reader threads = loader workers, epochs, steps, checkpoints, and the computation
  time per step from the SAME sleep profile the ``sleep`` variant would use at that batch size
  and accelerator count (host-to-device copy, compute and, with several ranks, the modelled
  all-reduce folded into it: DLIO has one computation time per step and no transfer or
  collective of its own).

docs/dlio.md documents the mapping and what it gives up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from core.errors import UserError
from workloads.config import PEER_VARIANTS, WorkloadConfig

#: The DLIO release the ``dlio`` image pins (images/requirements-dlio.txt).
DLIO_VERSION = "2.0.0"
#: The image that runs it (images/dlio/Dockerfile).
DLIO_IMAGE = "twintrace/dlio:latest"
#: The variant name of a DLIO run (beside the zoo images' original, instrumented and sleep).
DLIO_VARIANT = PEER_VARIANTS[0]
#: Where a DLIO run's container finds its configuration (``workload/twintrace.yaml`` under it,
#: a Hydra config directory), its dataset, and writes its outputs.
CONFIG_DIR = "/twintrace/ctl/dlio"
CONFIG_NAME = "twintrace"
DATA_DIR = "/data"
OUTPUT_DIR = "/twintrace/out/dlio"
CHECKPOINT_DIR = "/twintrace/out/checkpoints"

#: DLIO formats by the dataset generator of ours they stand for.
FORMATS = {"unet3d": "npz", "dlrm": "indexed_binary", "bert": "npz", "images": "jpeg"}


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What DLIO's generator writes to stand for one of our datasets.

    ``record_length`` is the bytes of a sample as DLIO understands it (it draws a 2-D array of
    ``int(sqrt(record_length))`` squared bytes, or a JPEG of that many pixels), ``target_bytes``
    the mean sample size of our dataset it should match, and ``substitutions`` says what DLIO
    cannot express and what stands in for it. ``batch_samples``: samples of ours in one DLIO
    sample (DLRM: a whole batch of records, read at once as our loader does; else 1), so DLIO's
    batch is ``batch_size / batch_samples`` of its samples.
    """

    source_generator: str
    format: str
    num_files: int
    samples_per_file: int
    record_length: int
    record_length_stdev: int
    target_bytes: float
    file_prefix: str = "img"
    substitutions: tuple[str, ...] = ()
    batch_samples: int = 1

    @property
    def samples(self) -> int:
        return self.num_files * self.samples_per_file

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "substitutions": list(self.substitutions)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatasetSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise UserError(f"DLIO dataset spec: unknown key {unknown[0]!r}")
        values = dict(data)
        values["substitutions"] = tuple(values.get("substitutions", ()))
        return cls(**values)

    def generator_section(self, data_folder: str = DATA_DIR) -> dict[str, Any]:
        """The ``dataset`` section of DLIO's configuration for this dataset."""
        return {
            "data_folder": data_folder,
            "format": self.format,
            "num_files_train": self.num_files,
            "num_files_eval": 0,
            "num_samples_per_file": self.samples_per_file,
            "record_length": self.record_length,
            "record_length_stdev": self.record_length_stdev,
            "file_prefix": self.file_prefix,
            "keep_files": True,
        }


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n)


def _files(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        raise UserError("the dataset's manifest.json lists no files: regenerate the dataset")
    return files


def dataset_spec(
    manifest: Mapping[str, Any], jpeg_bytes_per_pixel: float = 1.0, batch_size: int = 1
) -> DatasetSpec:
    """The dataset DLIO's generator must write to stand for the dataset of ``manifest`` (our
    generators' ``manifest.json``).

    - ``unet3d`` (KiTS19 ``case_*_x.npy`` + ``_y.npy`` pairs, read whole per sample): ``npz``,
      one file per case, a sample the size of the case's image and label together;
    - ``dlrm`` (one file of 160-byte records, one contiguous read of ``batch_size`` records per
      step): ``indexed_binary``, one file, a DLIO sample per batch of records (as DLIO's own
      DLRM configuration has it: ``record_length`` 327680 = 2048 x 160), DLIO batch 1; a
      sample per record would make DLIO's reader open the file and read 160 bytes 2048 times
      a step (about 20 s a step on 2 cores);
    - ``bert`` (TFRecord shards): ``npz``, one file per shard and a sample per record of the mean
      record size (DLIO reads TFRecord only through TensorFlow);
    - ``images`` (JPEG per image, or group files): ``jpeg``, one file per training image; the
      pixel count is chosen so that DLIO's noise JPEGs have our mean size
      (``jpeg_bytes_per_pixel``: the bytes per pixel of such a JPEG, measured by the caller).
    """
    generator = manifest.get("generator")
    if generator not in FORMATS:
        raise UserError(
            f"DLIO cannot emulate a {generator!r} dataset: it expresses "
            f"{', '.join(sorted(FORMATS))} datasets"
        )
    files = _files(manifest)
    if generator == "unet3d":
        cases: dict[str, int] = {}
        for f in files:
            name = str(f["name"])
            if name.endswith(("_x.npy", "_y.npy")):
                case = name[: -len("_x.npy")]
                cases[case] = cases.get(case, 0) + int(f["bytes"])
        if not cases:
            raise UserError("the unet3d dataset's manifest lists no case_*_x.npy files")
        mean, std = _mean_std(list(cases.values()))
        return DatasetSpec(
            generator,
            "npz",
            num_files=len(cases),
            samples_per_file=1,
            record_length=round(mean),
            record_length_stdev=round(std),
            target_bytes=mean,
            substitutions=(
                "a case's image (float32) and label (uint8) .npy files -> one .npz of random "
                "uint8 of their total size (DLIO draws 2-D shapes around sqrt(size))",
            ),
        )
    if generator == "dlrm":
        train = [f for f in files if str(f["name"]) == "train_data.bin"]
        if not train or "records" not in train[0]:
            raise UserError("the dlrm dataset's manifest has no train_data.bin with its records")
        records = int(train[0]["records"])
        record = int(train[0]["bytes"]) // records
        if batch_size < 1 or records < batch_size:
            raise UserError(
                f"the DLRM dataset holds {records} records, fewer than a batch of {batch_size}"
            )
        sample = batch_size * record
        side = int(math.sqrt(sample))
        return DatasetSpec(
            generator,
            "indexed_binary",
            num_files=1,
            samples_per_file=records // batch_size,
            record_length=sample,
            record_length_stdev=0,
            target_bytes=float(sample),
            substitutions=(
                f"a batch of {batch_size} {record}-byte records -> one DLIO sample of "
                f"{side * side} bytes (DLIO's samples are square arrays), DLIO batch 1, with "
                "its offset and size index files",
                "one pread of the batch at a random batch-aligned offset -> DLIO's reader "
                "opening the file, seeking to the sample and reading it, each step",
            ),
            batch_samples=batch_size,
        )
    if generator == "bert":
        shards = [f for f in files if str(f["name"]).startswith("part-")]
        if not shards or any("records" not in f for f in shards):
            raise UserError("the bert dataset's manifest lists no part-* shards with their records")
        records = [int(f["records"]) for f in shards]
        per_file = min(records)
        record = sum(int(f["bytes"]) for f in shards) / sum(records)
        return DatasetSpec(
            generator,
            "npz",
            num_files=len(shards),
            samples_per_file=per_file,
            record_length=round(record),
            record_length_stdev=0,
            target_bytes=record,
            substitutions=(
                "TFRecord shards of tf.train.Example records -> .npz files of random uint8 "
                "samples of the mean record size (DLIO reads TFRecord only through TensorFlow)",
                f"{min(records)}-{max(records)} records per shard -> {per_file} per file "
                "(DLIO's files hold equal sample counts)",
            ),
        )
    train = [f for f in files if str(f["name"]).startswith("train/")]
    params = manifest.get("params") or {}
    if params.get("group_size"):
        images = int(params.get("train_images") or 0)
        if images <= 0:
            raise UserError("the grouped image dataset's manifest does not say its train_images")
        mean = sum(int(f["bytes"]) for f in train) / images
        std = 0.0
        notes: tuple[str, ...] = (
            f"group files of {params['group_size']} images -> one JPEG file per image (DLIO "
            "has no grouped layout)",
        )
    else:
        if not train:
            raise UserError("the image dataset's manifest lists no train/ images")
        images = len(train)
        mean, std = _mean_std([int(f["bytes"]) for f in train])
        notes = ()
    if jpeg_bytes_per_pixel <= 0:
        raise UserError(f"jpeg_bytes_per_pixel must be positive, got {jpeg_bytes_per_pixel}")
    pixels = mean / jpeg_bytes_per_pixel
    return DatasetSpec(
        generator,
        "jpeg",
        num_files=images,
        samples_per_file=1,
        record_length=round(pixels),
        record_length_stdev=round(std / jpeg_bytes_per_pixel),
        target_bytes=mean,
        substitutions=(
            *notes,
            "photographs (colour, class folders) -> greyscale random-noise JPEGs of the same "
            "mean file size, all in one folder",
        ),
    )


@dataclasses.dataclass(frozen=True)
class Computation:
    """DLIO's computation time per step (seconds): mean and standard deviation, and what went
    into it (for the run's record)."""

    mean_s: float
    stdev_s: float
    parts: Mapping[str, float]


def computation(profile: Any, config: WorkloadConfig, gradient_bytes: int = 0) -> Computation:
    """The computation time of a step of ``config`` from a sleep profile
    (:class:`workloads.profile.SleepProfile`), as the ``sleep`` variant would emulate it: the
    mean host-to-device copy plus the compute (its mean and standard deviation, the measured
    table point where the profile has one), plus, with several accelerators, the modelled
    all-reduce of ``gradient_bytes``."""
    g = config.accelerators
    b = profile.profile_batch(config.batch_size, g)
    mean, std = profile.compute_params(g, b)
    h2d, _ = profile.h2d.params(g, b)
    allreduce = profile.collective.seconds(g, gradient_bytes) if g > 1 and gradient_bytes else 0.0
    parts = {"compute_s": float(mean), "h2d_s": float(h2d), "all_reduce_s": float(allreduce)}
    return Computation(float(mean + h2d + allreduce), float(std), parts)


def workload_config(
    config: WorkloadConfig,
    dataset: DatasetSpec,
    compute: Computation,
    checkpoint_bytes: int,
) -> dict[str, Any]:
    """The ``workload`` section of DLIO's configuration for a run of ``config`` over
    ``dataset`` (:func:`dataset_spec`): the same batch size per rank, reader threads = loader
    workers, epochs, steps per epoch (``max_steps``), seed, checkpoints every
    ``checkpoint_every`` epochs of ``checkpoint_bytes`` (the model's size), evaluation off (our
    workloads evaluate on their own schedule; DLIO would need a separate dataset)."""
    if compute.mean_s < 0 or compute.stdev_s < 0:
        raise UserError("the computation time must not be negative")
    train: dict[str, Any] = {
        "epochs": config.epochs,
        "computation_time": round(compute.mean_s, 6),
        "seed": config.seed,
    }
    if compute.stdev_s > 0:
        train["computation_time_stdev"] = round(compute.stdev_s, 6)
    files = files_for_ranks(dataset, config.accelerators)
    available = (
        files * dataset.samples_per_file // dlio_batch(config, dataset) // config.accelerators
    )
    if config.max_steps and config.max_steps < available:
        # a cap, as our max_steps is: DLIO refuses to run when it asks for more steps than its
        # files give ("Only have enough data for N steps")
        train["total_training_steps"] = config.max_steps
    checkpoint = config.checkpoint_every > 0
    section: dict[str, Any] = {
        "model": config.workload,
        "framework": "pytorch",
        "workflow": {
            "generate_data": False,
            "train": True,
            "evaluation": False,
            "checkpoint": checkpoint,
            "profiling": False,
        },
        "dataset": {**dataset.generator_section(), "num_files_train": files},
        "reader": {
            "data_loader": "pytorch",
            "batch_size": dlio_batch(config, dataset),
            "read_threads": config.workers,
            "file_shuffle": "seed",
            "sample_shuffle": "seed",
        },
        "train": train,
        # model_size always: DLIO builds its checkpoint tensor at start-up even when it writes
        # none (0.5-4 GB with its defaults). A checkpoint is the model's state alone, as ours
        # is: DLIO's defaults add a "layer" of 24.7 MB (layer_parameters [17371, 24740228],
        # num_layers 1) to every checkpoint whatever the model.
        "checkpoint": {
            "checkpoint_folder": CHECKPOINT_DIR,
            "model_size": max(1024, int(checkpoint_bytes)),
            "optimization_groups": [],
            "layer_parameters": [],
            "num_layers": 0,
        },
        "output": {"folder": OUTPUT_DIR, "log_file": "dlio.log"},
        "metric": {"au": 0.90},
    }
    if checkpoint:
        section["checkpoint"]["checkpoint_after_epoch"] = config.checkpoint_every
        section["checkpoint"]["epochs_between_checkpoints"] = config.checkpoint_every
    return section


def files_for_ranks(dataset: DatasetSpec, ranks: int) -> int:
    """The files a run of ``ranks`` MPI ranks tells DLIO to read: all of them, but DLIO 2.0.0
    fails (an IndexError in its sample map, after which the other ranks wait forever) unless
    the samples divide evenly among the ranks, so as many as keep them even (it reads the
    first N of its file list then: "A subset of files will be used")."""
    n = dataset.num_files
    while n > 0 and (n * dataset.samples_per_file) % ranks:
        n -= 1
    if n == 0:
        raise UserError(
            f"the DLIO dataset's {dataset.samples} samples cannot be shared evenly by "
            f"{ranks} ranks: use fewer accelerators or a larger dataset"
        )
    return n


def dlio_batch(config: WorkloadConfig, dataset: DatasetSpec) -> int:
    """DLIO's batch size (its samples per step and rank) for a run of ``config``."""
    if config.batch_size % dataset.batch_samples:
        raise UserError(
            f"the DLIO dataset holds batches of {dataset.batch_samples} samples: run with "
            f"--batch-size {dataset.batch_samples} (or a multiple), or make it again"
        )
    return config.batch_size // dataset.batch_samples


def generator_config(dataset: DatasetSpec, ranks: int = 1) -> dict[str, Any]:
    """The ``workload`` section that makes DLIO's generator write ``dataset`` and nothing else
    (``ranks``: the MPI ranks writing it)."""
    del ranks  # the same configuration for any number of ranks
    return {
        "model": f"{dataset.source_generator}-data",
        "framework": "pytorch",
        "workflow": {"generate_data": True, "train": False, "checkpoint": False},
        "dataset": dataset.generator_section(),
        "checkpoint": {"checkpoint_folder": CHECKPOINT_DIR, "model_size": 1024},
        "output": {"folder": OUTPUT_DIR, "log_file": "dlio.log"},
    }
