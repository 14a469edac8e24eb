"""The sampler's GPU lane (``tracing.samplers.Gpus``) against a fake ``pynvml`` module: no GPU is
on the build machines, so the NVML calls are answered by a module put into ``sys.modules`` with
known readings, and the rows are checked exactly, through the samples table and the timeline's
accelerator lane. A missing library, a failing ``nvmlInit`` and NVML errors mid-run give no GPU
rows (or fewer) and never stop the sampler."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from store.rundir import PHASES_COLUMNS, SAMPLES_COLUMNS, empty_frame
from tracing.ingest import build_samples
from tracing.samplers import Gpus, Sampler

GIB = 2**30


class FakeNVMLError(Exception):
    """pynvml.NVMLError's stand-in (pynvml raises subclasses of it, one per error code)."""


class FakeNVML(types.ModuleType):
    """The pynvml calls the sampler makes, answering from ``gpus``: NVML index -> (gpu %,
    memory %, used bytes), or an exception to raise for that device's handle / utilisation."""

    NVMLError = FakeNVMLError

    def __init__(
        self,
        gpus: dict[int, tuple[int, int, int]],
        *,
        init_error: Exception | None = None,
        refused: frozenset[int] = frozenset(),
        util_error: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.init_error = init_error
        self.refused = refused
        self.util_error = util_error
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index in self.refused:
            raise FakeNVMLError("Insufficient Permissions")
        return ("handle", index)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        index = handle[1]
        if index in self.util_error:
            raise FakeNVMLError("Not Supported")
        gpu, memory, _ = self.gpus[index]
        return types.SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        used = self.gpus[handle[1]][2]
        return types.SimpleNamespace(total=80 * GIB, free=80 * GIB - used, used=used)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.fixture()
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNVML:
    fake = FakeNVML({0: (97, 41, 85_899_345_921), 1: (3, 0, 1_234_567)})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_each_gpu_gives_util_mem_util_and_mem_used_rows(nvml: FakeNVML) -> None:
    gpus = Gpus()
    assert [index for index, _ in gpus.handles] == [0, 1]
    assert gpus.sample() == [
        ("gpu0_util", 97, "percent"),
        ("gpu0_mem_util", 41, "percent"),
        ("gpu0_mem_used", 85_899_345_921, "bytes"),
        ("gpu1_util", 3, "percent"),
        ("gpu1_mem_util", 0, "percent"),
        ("gpu1_mem_used", 1_234_567, "bytes"),
    ]
    gpus.close()
    gpus.close()  # a second close does nothing
    assert nvml.calls == ["init", "shutdown"]


def test_gpus_keep_their_nvml_index_when_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Docker's --gpus ids are NVML indices: gpu2's rows must say gpu2 even when gpu0 is not
    # readable (a GPU of another container, without permission).
    fake = FakeNVML({0: (1, 1, 1), 1: (50, 5, 10), 2: (60, 6, 20)}, refused=frozenset({0}))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = Gpus()
    assert {m for m, _, _ in gpus.sample()} == {
        f"gpu{i}_{name}" for i in (1, 2) for name in ("util", "mem_util", "mem_used")
    }


def test_an_nvml_error_in_one_query_drops_that_reading_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNVML({0: (10, 1, 100), 1: (20, 2, 200)}, util_error=frozenset({0}))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert Gpus().sample() == [
        ("gpu0_mem_used", 100, "bytes"),
        ("gpu1_util", 20, "percent"),
        ("gpu1_mem_util", 2, "percent"),
        ("gpu1_mem_used", 200, "bytes"),
    ]


@pytest.mark.parametrize(
    "module",
    [
        None,  # `import pynvml` raises ImportError: nvidia-ml-py is not installed
        FakeNVML({0: (1, 1, 1)}, init_error=FakeNVMLError("Driver Not Loaded")),
        FakeNVML({0: (1, 1, 1)}, init_error=OSError("libnvidia-ml.so.1: cannot open")),
        FakeNVML({}),  # a driver and no GPU
    ],
    ids=["no library", "no driver", "no libnvidia-ml", "no gpu"],
)
def test_without_nvml_or_a_gpu_there_is_no_gpu_lane(
    monkeypatch: pytest.MonkeyPatch, module: FakeNVML | None
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", module)
    gpus = Gpus()
    assert gpus.handles == [] and gpus.sample() == []
    gpus.close()
    if module is not None and module.init_error is not None:
        assert module.calls == ["init"]  # no shutdown without a successful init


def _sample(tmp_path: Path, seconds: float = 0.25) -> tuple[Sampler, pd.DataFrame]:
    """Run the real sampler (host CPU and GPUs, no container) briefly; its samples table."""
    raw = tmp_path / "raw"
    raw.mkdir()
    sampler = Sampler(raw / "samples.csv", {}, interval=0.02)
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    return sampler, build_samples(raw)


def test_gpu_rows_flow_into_the_samples_table(tmp_path: Path, nvml: FakeNVML) -> None:
    sampler, samples = _sample(tmp_path)
    assert sampler.error is None and sampler.samples >= 3
    assert dict(samples.dtypes.astype(str)) == dict(SAMPLES_COLUMNS)
    gpu = samples[samples["metric"].str.startswith("gpu")]
    assert len(gpu) == 6 * sampler.samples
    # Host-wide rows (no container); every reading exact, the byte count too.
    assert gpu["container"].isna().all()
    last = gpu[gpu["ts_ns"] == gpu["ts_ns"].max()].set_index("metric")
    assert last["value"].to_dict() == {
        "gpu0_util": 97.0,
        "gpu0_mem_util": 41.0,
        "gpu0_mem_used": 85_899_345_921.0,
        "gpu1_util": 3.0,
        "gpu1_mem_util": 0.0,
        "gpu1_mem_used": 1_234_567.0,
    }
    assert set(last["unit"]) == {"percent", "bytes"}
    # One timestamp for a sample's host and GPU rows: they line up with the other tables.
    host = samples[samples["metric"] == "host_cpu_idle"]
    assert set(gpu["ts_ns"]) == set(host["ts_ns"])
    assert nvml.calls == ["init", "shutdown"]

    # The timeline draws the GPU utilisation lane from these rows.
    from analysis.timeline import _accelerator_lane, _Clock

    origin = int(samples["ts_ns"].min())
    lane = _accelerator_lane(empty_frame(PHASES_COLUMNS), samples, _Clock(origin, 0.0, 1.0, 1.0))
    assert sorted(trace.name for trace, _ in lane.traces) == [
        "gpu0_mem_util %",
        "gpu0_util %",
        "gpu1_mem_util %",
        "gpu1_util %",
    ]


def test_a_gpu_failing_mid_run_does_not_stop_the_sampler(tmp_path: Path, nvml: FakeNVML) -> None:
    real = nvml.nvmlDeviceGetMemoryInfo

    def lost(handle: Any) -> Any:  # gpu1 falls off the bus after a few readings
        if handle[1] == 1 and nvml.calls.count("mem") >= 4:
            raise FakeNVMLError("GPU is lost")
        nvml.calls.append("mem")
        return real(handle)

    nvml.nvmlDeviceGetMemoryInfo = lost  # type: ignore[method-assign]
    sampler, samples = _sample(tmp_path)
    assert sampler.error is None
    counts = samples["metric"].value_counts()
    assert counts["gpu0_mem_used"] == counts["host_cpu_idle"] == sampler.samples
    assert counts["gpu1_mem_used"] < sampler.samples
    assert counts["gpu1_util"] == sampler.samples


def test_no_nvml_no_gpu_rows_and_the_host_is_still_sampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sampler, samples = _sample(tmp_path)
    assert sampler.error is None and sampler.samples >= 3
    assert not samples["metric"].str.startswith("gpu").any()
    assert (samples["metric"] == "host_cpu_idle").sum() == sampler.samples
