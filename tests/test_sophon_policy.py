"""SOPHON's selective offload policy on synthetic profiles (known answers), its profile file, the
bandwidth option's parser and the network counters' reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import UserError
from tests.conftest import assert_refuses_other_results
from tracing.samplers import net_bytes
from tracing.shaper import format_rate, parse_rate, tbf_command
from workloads.sophon.policy import (
    SampleProfile,
    plan_offload,
    read_profile,
    write_profile,
)
from workloads.sophon.stages import CROPPED, DECODED, FLIPPED, RAW, TENSOR

MS = 1_000_000  # ns


def sample(index: int, raw: int, cropped: int = 150_528, decode_ms: float = 10.0) -> SampleProfile:
    """A JPEG of ``raw`` bytes decoded to 1 MB, cropped to ``cropped`` bytes, 4x as a tensor."""
    return SampleProfile(
        index,
        (raw, 1_000_000, cropped, cropped, 4 * cropped),
        (int(decode_ms * MS), 2 * MS, 1 * MS, 3 * MS),
    )


def test_best_stage_is_the_first_smallest_intermediate() -> None:
    big = sample(0, 300_000)
    assert big.best_stage() == CROPPED  # flipped is as small, not smaller: the crop is cheaper
    assert big.saving(CROPPED) == 300_000 - 150_528
    assert big.cost_ns(CROPPED) == 12 * MS  # decode + crop
    small = sample(1, 100_000)
    assert small.best_stage() == RAW  # nothing is smaller than the file
    decoded = SampleProfile(2, (500, 400, 450, 450, 1800), (1, 1, 1, 1))
    assert decoded.best_stage() == DECODED
    with pytest.raises(ValueError, match="5 sizes and 4 CPU times"):
        SampleProfile(3, (1, 2), (1,))


def test_nothing_is_offloaded_when_the_network_is_not_the_bottleneck() -> None:
    profiles = [sample(i, 300_000) for i in range(10)]
    # 3 MB at 1 GB/s: 3 ms of network. Offloading the first sample would cost 12 ms of storage
    # CPU, more than the 3 ms it would shorten: nothing is offloaded.
    plan = plan_offload(profiles, storage_cpus=1, bandwidth_bytes_s=1e9)
    assert plan.offloaded == 0
    assert plan.network_s == pytest.approx(3e-3)
    assert plan.planned_epoch_s == pytest.approx(3e-3)


def test_everything_that_shrinks_is_offloaded_on_a_slow_link() -> None:
    profiles = [sample(i, 300_000) for i in range(8)] + [sample(8, 100_000)]
    plan = plan_offload(profiles, storage_cpus=4, bandwidth_bytes_s=10e3)  # 10 kB/s
    assert plan.offloaded == 8
    assert {plan.stages[i] for i in range(8)} == {CROPPED} and plan.stages[8] == RAW
    remaining = 8 * 150_528 + 100_000
    assert plan.planned_network_s == pytest.approx(remaining / 10e3)
    assert plan.storage_cpu_s == pytest.approx(8 * 12e-3 / 4)
    summary = plan.summary()
    assert summary["at_cropped"] == 8 and summary["at_raw"] == 1 and summary["samples"] == 9


def test_most_efficient_first_and_stop_where_network_meets_cpu() -> None:
    # Savings per CPU second: sample 0 saves 400 kB for 10 ms (40 MB/s), sample 1 saves 200 kB
    # for 10 ms (20 MB/s), sample 2 saves 100 kB for 10 ms (10 MB/s). Link 10 MB/s, 1 core.
    profiles = [
        SampleProfile(0, (500_000, 10**7, 100_000, 100_000, 400_000), (8 * MS, 2 * MS, 0, 0)),
        SampleProfile(1, (300_000, 10**7, 100_000, 100_000, 400_000), (8 * MS, 2 * MS, 0, 0)),
        SampleProfile(2, (200_000, 10**7, 100_000, 100_000, 400_000), (8 * MS, 2 * MS, 0, 0)),
    ]
    plan = plan_offload(profiles, storage_cpus=1, bandwidth_bytes_s=10e6)
    # Start: 1 MB = 100 ms of network, 0 CPU. After 0: 60 ms vs 10 ms. After 1: 40 vs 20.
    # After 2: 30 vs 30: offloaded (the bound drops from 40 to 30), then they are equal: stop.
    assert plan.stages == {0: CROPPED, 1: CROPPED, 2: CROPPED}
    assert plan.planned_network_s == pytest.approx(0.03)
    assert plan.storage_cpu_s == pytest.approx(0.03)
    # A slower storage CPU (half a core): after 0, 60 vs 20; after 1, 40 vs 40: stop there.
    half = plan_offload(profiles, storage_cpus=0.5, bandwidth_bytes_s=10e6)
    assert half.stages == {0: CROPPED, 1: CROPPED, 2: RAW}
    assert half.planned_epoch_s == pytest.approx(0.04)


def test_the_crossing_sample_is_taken_only_when_it_lowers_the_bound() -> None:
    # Network 100 ms; one sample saving 90 ms of network for 95 ms of CPU: after it, 10 vs 95,
    # bound 95 < 100: taken. The same for 150 ms of CPU: 150 > 100: left out.
    cheap = SampleProfile(0, (1_000_000, 10**7, 100_000, 100_000, 400_000), (95 * MS, 0, 0, 0))
    dear = SampleProfile(0, (1_000_000, 10**7, 100_000, 100_000, 400_000), (150 * MS, 0, 0, 0))
    assert plan_offload([cheap], 1, 10e6).offloaded == 1
    assert plan_offload([dear], 1, 10e6).offloaded == 0


def test_free_transforms_rank_first() -> None:
    profiles = [
        SampleProfile(0, (300_000, 10**6, 150_000, 150_000, 600_000), (10 * MS, 1, 0, 0)),
        SampleProfile(1, (300_000, 250_000, 150_000, 150_000, 600_000), (0, 0, 0, 0)),
    ]
    plan = plan_offload(profiles, 1, 1e3)
    assert plan.stages == {0: CROPPED, 1: CROPPED}


def test_bad_policy_inputs() -> None:
    with pytest.raises(UserError, match="CPUs must be positive"):
        plan_offload([sample(0, 1)], 0, 1e6)
    with pytest.raises(UserError, match="bandwidth must be positive"):
        plan_offload([sample(0, 1)], 1, float("nan"))
    assert plan_offload([], 1, 1e6).offloaded == 0


def test_profile_file_round_trip(tmp_path: Path) -> None:
    profiles = [sample(i, 300_000 + i) for i in range(3)]
    path = tmp_path / "profile.csv"
    write_profile(path, profiles)
    assert path.read_text().splitlines()[0].startswith("index,raw_bytes,decoded_bytes")
    assert read_profile(path) == profiles
    path.write_text("index,x\n1,2\n")
    with pytest.raises(UserError, match="is not an offload profile"):
        read_profile(path)
    with pytest.raises(UserError, match="cannot read the offload profile"):
        read_profile(tmp_path / "missing.csv")


def test_stage_numbers_match_the_proto() -> None:
    from workloads.sophon import rpc

    pb2, _ = rpc.modules()
    assert (pb2.RAW, pb2.DECODED, pb2.CROPPED, pb2.FLIPPED, pb2.TENSOR) == (
        RAW,
        DECODED,
        CROPPED,
        FLIPPED,
        TENSOR,
    )


@pytest.mark.parametrize(
    "text,bits",
    [("430mbit", 430_000_000), ("1gbit", 10**9), ("500kbit", 500_000), ("1.5Mbit", 1_500_000)],
)
def test_parse_rate(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["430", "430mb", "fast", "10bit", "2000gbit", "-5mbit"])
def test_parse_rate_refuses_with_one_line(text: str) -> None:
    with pytest.raises(UserError) as info:
        parse_rate(text)
    assert "\n" not in str(info.value) and str(info.value).startswith(
        ("bad net_bandwidth", "net_bandwidth")
    )


def test_tbf_command_and_rate_text() -> None:
    argv = tbf_command("veth1234", 430_000_000)
    assert argv[:7] == ["tc", "qdisc", "replace", "dev", "veth1234", "root", "tbf"]
    assert argv[argv.index("rate") + 1] == "430000000bit"
    # The bucket: 4 ms at 430 Mbit/s is 215 kB (above the 64 KiB floor).
    assert argv[argv.index("burst") + 1] == "215000b"
    assert format_rate(430e6) == "430 Mbit/s"


def test_net_bytes_sums_every_interface_but_loopback(tmp_path: Path) -> None:
    dev = tmp_path / "42" / "net"
    dev.mkdir(parents=True)
    (dev / "dev").write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets "
        "errs drop fifo colls carrier compressed\n"
        "    lo:  999999      10    0    0    0     0          0         0   999999      10"
        "    0    0    0     0       0          0\n"
        "  eth0: 1500000    1000    0    0    0     0          0         0    20000     300"
        "    0    0    0     0       0          0\n"
        "  eth1:     500       5    0    0    0     0          0         0      700       7"
        "    0    0    0     0       0          0\n"
    )
    assert net_bytes(42, proc=tmp_path) == (1_500_500, 20_700)
    assert net_bytes(43, proc=tmp_path) is None


def test_study_results_of_another_kind_version_or_damaged_are_refused(tmp_path: Path) -> None:
    import json

    from experiments.sophon import load_results

    path = tmp_path / "sophon.json"
    with pytest.raises(UserError, match="does not exist: run the study first"):
        load_results(path)
    path.write_text("{not json")
    with pytest.raises(UserError, match="is damaged"):
        load_results(path)
    assert_refuses_other_results(load_results, path, "sophon", "hfta")
    path.write_text(json.dumps({"kind": "sophon", "schema_version": 1, "cells": []}))
    assert load_results(path)["cells"] == []
