"""The clock-offset estimator (tracing/clock.py): NTP's four timestamps, the exchange with the
smallest round trip kept, half of it the bound. Checked on synthetic exchanges with a known
offset and asymmetric legs, and through a real agent whose clock is shifted by a known amount
(hosts of the virtual cluster share one kernel: their true offset is 0)."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import reaped
from tracing.agent import Agent, AgentClient, serve
from tracing.clock import (
    MAX_ROUNDS,
    ROUNDS,
    TARGET_BOUND_NS,
    Exchange,
    drift_ppm,
    estimate,
    host_clock,
    measure,
)

REPO = Path(__file__).resolve().parent.parent


def _exchange(t0: int, offset: int, out_leg: int, back_leg: int, hold: int) -> Exchange:
    """An exchange with a host whose clock reads ``offset`` more than ours."""
    t1 = t0 + out_leg + offset
    t2 = t1 + hold
    return Exchange(t0, t1, t2, t2 - offset + back_leg)


def test_symmetric_legs_give_the_offset_exactly() -> None:
    e = _exchange(1_000, offset=-123_456, out_leg=50_000, back_leg=50_000, hold=7_000)
    assert e.offset_ns == -123_456 and e.delay_ns == 100_000


@pytest.mark.parametrize("offset", [0, 5_000_000_000, -987_654_321, 1])
def test_the_true_offset_is_within_the_bound_however_uneven_the_legs(offset: int) -> None:
    rng = random.Random(offset)
    exchanges = [
        _exchange(
            i * 10_000_000,
            offset,
            rng.randint(20_000, 400_000),
            rng.randint(20_000, 400_000),
            rng.randint(1_000, 50_000),
        )
        for i in range(8)
    ]
    found = estimate(exchanges)
    assert abs(found.offset_ns - offset) <= found.bound_ns
    best = min(exchanges, key=lambda e: e.delay_ns)
    assert found.bound_ns == -(-best.delay_ns // 2) + 1 and found.rounds == 8


def test_the_smallest_round_trip_is_kept() -> None:
    slow = _exchange(0, 1000, 900_000, 100_000, 0)  # offset wrong by 400 us
    fast = _exchange(10**6, 1000, 30_000, 30_000, 0)
    found = estimate([slow, fast, slow])
    assert found.offset_ns == 1000 and found.bound_ns == 30_001


def test_drift_over_a_run() -> None:
    before = estimate([_exchange(0, 0, 1000, 1000, 0)])
    after = estimate([_exchange(10**10, 200_000, 1000, 1000, 0)])  # 200 us in 10 s
    drift, bound = drift_ppm(before, after)
    assert drift == pytest.approx(20.0, abs=1e-6) and bound == pytest.approx(0.2002)
    record = host_clock(before, after)
    assert record["drift_ppm"] == 20.0 and record["offset_ns"] in (0, 200_000)
    assert host_clock(before, None)["drift_ppm"] is None
    with pytest.raises(ValueError, match="no exchange"):
        estimate([])


def test_measure_calls_the_host_once_per_round() -> None:
    calls = []
    ticks = iter(range(0, 10**6, 100))

    def ask() -> tuple[int, int]:
        calls.append(1)
        t = next(ticks)
        return t + 7_000, t + 7_010

    found = measure(ask, rounds=5, clock=lambda: next(ticks))
    assert len(calls) == 5 and found.rounds == 5
    assert abs(found.offset_ns - 7_000) <= found.bound_ns


def _slow_then_fast(slow: int) -> tuple[Callable[[], tuple[int, int]], Callable[[], int]]:
    """An agent 5 us ahead whose first ``slow`` round trips take 3 ms (a busy host), the next
    20 us; its ``ask`` and the coordinator's clock."""
    now = [0]
    calls = [0]

    def clock() -> int:
        return now[0]

    def ask() -> tuple[int, int]:
        calls[0] += 1
        leg = 1_500_000 if calls[0] <= slow else 10_000
        now[0] += leg
        t1 = now[0] + 5_000
        now[0] += leg
        return t1, t1

    return ask, clock


def test_a_busy_host_gets_more_exchanges_until_the_bound_is_tight() -> None:
    ask, clock = _slow_then_fast(slow=20)
    found = measure(ask, clock=clock)
    assert found.rounds == 21 and found.bound_ns <= TARGET_BOUND_NS
    assert abs(found.offset_ns - 5_000) <= found.bound_ns
    # Never faster: it stops at MAX_ROUNDS with the best it had.
    ask, clock = _slow_then_fast(slow=10**6)
    found = measure(ask, clock=clock)
    assert found.rounds == MAX_ROUNDS and found.bound_ns > TARGET_BOUND_NS
    # A quiet host: ROUNDS, no more.
    ask, clock = _slow_then_fast(slow=0)
    assert measure(ask, clock=clock).rounds == ROUNDS


@pytest.mark.parametrize("offset", [0, 3_600_000_000_000, -42_000_017])
def test_a_real_agent_with_a_shifted_clock_is_recovered_within_the_bound(offset: int) -> None:
    """In-process agent over real gRPC on loopback: the injected offset comes back within
    the bound, and the bound is under 1 ms."""
    agent = Agent(lease_s=60.0, clock_offset_ns=offset)
    server, port = serve(agent, "127.0.0.1:0")
    client = AgentClient(f"127.0.0.1:{port}", timeout=10.0)
    try:
        found = client.clock()
    finally:
        client.close()
        server.stop(grace=None)
    assert abs(found.offset_ns - offset) <= found.bound_ns, found
    assert found.bound_ns <= 1_000_000, found


def test_the_agent_process_takes_the_offset_from_its_command_line() -> None:
    """`python3 -m tracing.agent --clock-offset-ns N`: what the agent's container is started
    with for the estimator's tests on the cluster."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracing.agent",
            "--listen",
            "127.0.0.1:0",
            "--clock-offset-ns",
            "250000000",
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    with reaped(proc):
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            if "listening on port" in line:
                port = int(line.split("listening on port")[1].split()[0])
        assert port is not None, "the agent did not say its port"
        client = AgentClient(f"127.0.0.1:{port}", timeout=10.0)
        found = client.clock(rounds=8)
        client.call("Shutdown")
        client.close()
        assert abs(found.offset_ns - 250_000_000) <= found.bound_ns <= 1_000_000, found
        assert proc.wait(timeout=30) == 0
