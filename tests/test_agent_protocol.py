"""The tracer agent's protocol (tracing/agent.py), served in this process on loopback: its
calls, their order, bad requests, Fetch and collect across two folders (two hosts), the lease,
and finding a container's first process in a /proc tree."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import pytest

from core.errors import UserError
from tracing.agent import (
    PROTOCOL,
    SERVICE,
    Agent,
    AgentClient,
    RunSide,
    container_processes,
    first_process,
    serve,
    sources_digest,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def served():
    """An idle agent on a loopback port and a client of it."""
    agent = Agent(lease_s=60.0, sources=sources_digest(REPO))
    server, port = serve(agent, "127.0.0.1:0")
    client = AgentClient(f"127.0.0.1:{port}", timeout=10.0)
    yield agent, client
    client.close()
    server.stop(grace=None)


def test_hello_names_the_protocol_the_sources_and_the_state(served) -> None:
    agent, client = served
    hello = client.call("Hello")
    assert hello["protocol"] == PROTOCOL and hello["state"] == "idle"
    assert hello["sources"] == sources_digest(REPO) and len(hello["sources"]) == 16
    assert set(hello) == {"protocol", "sources", "pid", "state"}


def test_the_sources_digest_follows_the_tracing_code(tmp_path: Path) -> None:
    (tmp_path / "tracing" / "bpf").mkdir(parents=True)
    (tmp_path / "core").mkdir()
    (tmp_path / "tracing" / "agent.py").write_text("a = 1\n")
    (tmp_path / "tracing" / "bpf" / "x.bt").write_text("BEGIN {}\n")
    before = sources_digest(tmp_path)
    (tmp_path / "analysis.py").write_text("not traced code\n")
    assert sources_digest(tmp_path) == before
    (tmp_path / "tracing" / "bpf" / "x.bt").write_text("BEGIN { exit(); }\n")
    assert sources_digest(tmp_path) != before


def test_the_image_holds_the_code_the_digest_covers() -> None:
    """images/build.py copies into the tracer's image the trees the agent's digest covers (it
    may not import tracing: the two lists are kept apart and must agree)."""
    from images.build import TRACER_SOURCES, tracer_sources
    from tracing.agent import SOURCE_GLOBS

    assert TRACER_SOURCES == SOURCE_GLOBS
    copied = {str(path.relative_to(REPO)) for path in tracer_sources()}
    assert {"tracing/agent.py", "tracing/bpf/cache.bt", "core/errors.py"} <= copied


def test_calls_out_of_order_are_refused_with_one_line(served, tmp_path: Path) -> None:
    _, client = served
    with pytest.raises(UserError, match="refused Release: the agent is idle, not attached"):
        client.call("Release")
    with pytest.raises(UserError, match="refused Release: bad Release at_ns 'soon'"):
        client.call("Release", {"at_ns": "soon"})
    with pytest.raises(UserError, match="refused Stop: no run to stop"):
        client.call("Stop")
    with pytest.raises(UserError, match="refused Fetch: Fetch comes after Stop"):
        client.fetch("raw/samples.csv", tmp_path / "x")
    assert not list(tmp_path.iterdir())


def test_bad_requests_are_invalid_arguments(served, tmp_path: Path) -> None:
    _, client = served
    raw = client.channel.unary_unary(f"/{SERVICE}/Attach")
    with pytest.raises(grpc.RpcError) as caught:
        raw(b"[1, 2]", timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a JSON object" in caught.value.details()
    with pytest.raises(UserError, match="bad Attach: KeyError"):
        client.call("Attach", {"run_dir": str(tmp_path)})
    (tmp_path / "raw").mkdir()
    with pytest.raises(UserError, match="names no container"):
        client.call("Attach", {"run_id": "r", "run_dir": str(tmp_path), "containers": []})
    one = [{"role": "main", "container_id": "f" * 64, "barrier": "ctl/main"}]
    with pytest.raises(UserError, match="unknown scripts: nope"):
        client.call(
            "Attach",
            {"run_id": "r", "run_dir": str(tmp_path), "containers": one, "scripts": ["nope"]},
        )
    with pytest.raises(UserError, match=f"{tmp_path / 'elsewhere'}/raw is not a folder"):
        client.call(
            "Attach", {"run_id": "r", "run_dir": str(tmp_path / "elsewhere"), "containers": one}
        )


def test_attach_to_a_container_this_host_does_not_run_fails_and_leaves_the_agent_stopped(
    served, tmp_path: Path
) -> None:
    agent, client = served
    (tmp_path / "raw").mkdir()
    (tmp_path / "ctl").mkdir()
    one = [{"role": "main", "container_id": "0123456789ab" * 5, "barrier": "ctl/main"}]
    with pytest.raises(
        UserError, match=r"container main \(0123456789ab\) has no process on this host"
    ):
        client.call("Attach", {"run_id": "r", "run_dir": str(tmp_path), "containers": one})
    assert client.call("Status") == {"state": "stopped", "failed": None, "released_ns": None}
    with pytest.raises(UserError, match="already serves run r"):
        client.call("Attach", {"run_id": "s", "run_dir": str(tmp_path), "containers": one})


def _stopped_run(agent: Agent, run_dir: Path, files: dict[str, bytes]) -> list[dict]:
    """Put ``agent`` in the state of a stopped run whose outputs are ``files``."""
    (run_dir / "raw").mkdir(parents=True)
    for name, data in files.items():
        (run_dir / name).write_bytes(data)
    run = RunSide(
        {
            "run_id": "r",
            "run_dir": str(run_dir),
            "containers": [{"role": "main", "container_id": "x", "barrier": "ctl/main"}],
        }
    )
    listed = [{"path": name, "size": len(data)} for name, data in files.items()]
    run.stopped = {"exit_codes": {}, "missed_probes": {}, "sampler_error": None, "files": listed}
    agent.run, agent.state = run, "stopped"
    return listed


def test_collect_fetches_what_this_host_does_not_see_whole(served, tmp_path: Path) -> None:
    """The coordinator on another host (another folder) gets every output byte for byte, in
    several chunks for a large one; one it sees at its size is not fetched again."""
    agent, client = served
    big = bytes(range(256)) * 9000  # 2.2 MiB: three chunks
    files = {
        "raw/syscalls.txt": big,
        "raw/samples.csv": b"ts_ns,metric\n1,x\n",
        "raw/proc.txt": b"",
    }
    listed = _stopped_run(agent, tmp_path / "agent-host", files)
    here = tmp_path / "coordinator"
    (here / "raw").mkdir(parents=True)
    (here / "raw" / "samples.csv").write_bytes(files["raw/samples.csv"])  # already here, whole
    (here / "raw" / "proc.txt").write_bytes(b"half")  # here but not at its size
    fetched = client.collect(here, listed)
    assert sorted(fetched) == ["raw/proc.txt", "raw/syscalls.txt"]
    for name, data in files.items():
        assert (here / name).read_bytes() == data
    assert not list(here.rglob("*.part"))


def test_fetch_serves_only_the_runs_outputs(served, tmp_path: Path) -> None:
    agent, client = served
    _stopped_run(agent, tmp_path / "run", {"raw/a.txt": b"a"})
    (tmp_path / "secret").write_text("not an output")
    for path in ("../secret", "raw/../../secret", "/etc/passwd", "raw/b.txt"):
        with pytest.raises(UserError, match="is not an output"):
            client.fetch(path, tmp_path / "got")
    assert not (tmp_path / "got").exists() and not (tmp_path / "got.part").exists()


def test_an_agent_that_hears_nothing_for_its_lease_gives_up(tmp_path: Path) -> None:
    agent = Agent(lease_s=0.5)
    stopped = []
    _stopped_run(agent, tmp_path, {})
    agent.state = "released"  # as if running: give_up must stop it
    agent.run.stop = lambda: stopped.append(time.monotonic()) or {}
    started = time.monotonic()
    watcher = threading.Thread(target=agent.watch_lease, daemon=True)
    watcher.start()
    assert agent.done.wait(10), "the lease never ran out"
    assert stopped and stopped[0] - started >= 0.5
    assert agent.state == "stopped"


def test_a_call_renews_the_lease(served) -> None:
    agent, client = served
    agent.lease_s = 1.0
    watcher = threading.Thread(target=agent.watch_lease, daemon=True)
    watcher.start()
    for _ in range(8):  # 2 s of calls every 0.25 s: never 1 s without one
        client.call("Status")
        time.sleep(0.25)
    assert not agent.done.is_set()
    agent.done.set()


def test_an_agent_that_is_gone_stopped_answering(tmp_path: Path) -> None:
    agent = Agent()
    server, port = serve(agent, "127.0.0.1:0")
    server.stop(grace=None).wait()
    client = AgentClient(f"127.0.0.1:{port}", timeout=2.0)
    with pytest.raises(UserError, match=rf"the tracer agent at 127.0.0.1:{port} stopped answering"):
        client.call("Status")
    client.close()


def test_the_containers_first_process_is_the_root_of_its_tree(tmp_path: Path) -> None:
    """Processes are found by the container id in their cgroup paths (cgroup v1 and v2,
    Docker's cgroupfs and systemd drivers); the first is the one whose parent is outside."""
    cid = "ab" * 32
    procs = {
        100: (1, f"0::/system.slice/docker-{cid}.scope\n"),  # v2, systemd driver
        120: (100, f"12:memory:/docker/{cid}\n0::/docker/{cid}\n"),  # v1 + v2, cgroupfs
        130: (120, f"0::/docker/{cid}\n"),
        200: (1, "0::/docker/" + "cd" * 32 + "\n"),  # another container
        300: (1, "0::/user.slice\n"),
    }
    for pid, (parent, cgroup) in procs.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (sh (x)) S {parent} {pid} 0\n")
    (tmp_path / "self").mkdir()
    found = sorted(container_processes(cid, tmp_path))
    assert found == [100, 120, 130]
    assert first_process(found, tmp_path) == 100
    assert first_process([120, 130], tmp_path) == 120
    assert container_processes("ef" * 32, tmp_path) == []


def test_replies_are_json_objects_any_grpc_client_can_read(served) -> None:
    """No generated code: the raw bytes of a reply are a JSON object."""
    _, client = served
    raw = client.channel.unary_unary(f"/{SERVICE}/Status")
    assert json.loads(raw(b"{}", timeout=5)) == {
        "state": "idle",
        "failed": None,
        "released_ns": None,
    }


def _held(tmp_path: Path, role: str) -> tuple[Path, list[bytes]]:
    """A barrier FIFO of ``role`` and a reader thread's record of what came through it."""
    import os

    from tracing.barrier import RELEASE_FIFO

    barrier = tmp_path / "ctl" / role
    barrier.mkdir(parents=True)
    os.mkfifo(barrier / RELEASE_FIFO)
    got: list[bytes] = []

    def read() -> None:
        with open(barrier / RELEASE_FIFO, "rb") as fifo:
            got.append(fifo.readline())
            got.append(str(time.monotonic_ns()).encode())

    threading.Thread(target=read, daemon=True).start()
    return barrier, got


def test_a_timed_release_answers_at_once_and_lets_go_at_its_instant(tmp_path: Path) -> None:
    """Release with at_ns (the joint release across hosts) answers before the instant, lets
    the containers go at it and says when in released_ns; Stop cancels a release to come."""
    (tmp_path / "raw").mkdir()
    barrier, got = _held(tmp_path, "a")
    side = RunSide(
        {
            "run_id": "r",
            "run_dir": str(tmp_path),
            "containers": [{"role": "a", "container_id": "x", "barrier": "ctl/a"}],
        }
    )
    at = time.monotonic_ns() + 200_000_000
    assert side.release(at) == {"released_ns": None}
    assert time.monotonic_ns() < at and side.released_ns is None
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got[0] == b"go\n" and at <= int(got[1]) < at + 50_000_000
    assert side.released_ns is not None and at <= side.released_ns < at + 50_000_000
    side.stop()
    # A release still to come when the run stops never comes.
    later = RunSide(
        {
            "run_id": "r2",
            "run_dir": str(tmp_path),
            "containers": [{"role": "b", "container_id": "y", "barrier": "ctl/b"}],
        }
    )
    _, never = _held(tmp_path, "b")
    later.release(time.monotonic_ns() + 300_000_000)
    later.stop()
    time.sleep(0.5)
    assert never == [] and later.released_ns is None and later.failed() is None
