"""twintrace-rsh (images/dlio/rsh.py), the remote shell of DLIO's rank containers, on loopback:
the command runs as ssh runs it, its output and exit code come back, a wrong token runs
nothing, a client that goes away takes its command with it (the server ending well: the launcher decides), and a server that hears nothing
gives up. The real thing (mpirun starting Open MPI's daemon through it, in containers and
across nodes) is in tests/test_dlio.py and tests/test_cluster.py."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

RSH = Path(__file__).resolve().parent.parent / "images" / "dlio" / "rsh.py"


def _module():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("twintrace_rsh", RSH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "rsh.token"
    path.write_text("s3cret\n")
    return path


def _serve(port: int, token: Path, wait: float = 20.0) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(RSH), "--serve", "--port", str(port), "--token-file", str(token),
         "--wait", str(wait)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the server did not listen")


def _client(
    port: int, token: Path, *words: str, wait: float = 5.0
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, str(RSH), "--port", str(port), "--token-file", str(token),
         "--wait", str(wait), "127.0.0.1", *words],
        capture_output=True, timeout=30,
    )  # fmt: skip


def test_a_command_runs_as_ssh_runs_it_and_its_output_and_code_come_back(token: Path) -> None:
    port = _free_port()
    # A probe without the token first: the server answers nothing and keeps waiting.
    server = _serve(port, token)
    with socket.create_connection(("127.0.0.1", port)) as probe:
        probe.sendall(json.dumps({"token": "wrong", "command": "touch /tmp/x"}).encode() + b"\n")
        assert probe.recv(16) == b""  # closed without a frame
    # The words joined by spaces, then run by /bin/sh -c (so "$X" and ; are the shell's).
    done = _client(port, token, "echo", "out;", "echo", "err", ">&2;", "exit", "3")
    assert done.returncode == 3
    assert done.stdout == b"out\n" and done.stderr == b"err\n"
    assert server.wait(10) == 3  # it served one command and exits with its code


def test_a_wrong_token_runs_nothing_and_the_client_says_so(token: Path, tmp_path: Path) -> None:
    port = _free_port()
    server = _serve(port, token, wait=2.0)
    other = tmp_path / "other.token"
    other.write_text("guess\n")
    marker = tmp_path / "ran"
    done = _client(port, other, "touch", str(marker))
    assert done.returncode == 255 and b"ended early" in done.stderr
    assert not marker.exists()
    assert server.wait(10) == 1  # nothing with the token came: it gave up
    assert server.stderr is not None and b"no launch came within 2 s" in server.stderr.read()


def test_a_client_that_goes_away_takes_its_command_with_it(token: Path, tmp_path: Path) -> None:
    port = _free_port()
    server = _serve(port, token)
    pidfile = tmp_path / "pid"
    sock = socket.create_connection(("127.0.0.1", port))
    request = {"token": "s3cret", "command": f"echo $$ > {pidfile}; exec sleep 60"}
    sock.sendall(json.dumps(request).encode() + b"\n")
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    sock.close()  # mpirun done (or killed): it closes its remote shells
    assert server.wait(10) == 0  # the launcher's exit code is the job's (module doc)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_an_unreachable_host_is_ssh_s_255(token: Path) -> None:
    started = time.monotonic()
    done = _client(_free_port(), token, "true", wait=1.0)
    assert done.returncode == 255 and b"cannot reach" in done.stderr
    assert b"within 1 s" in done.stderr and time.monotonic() - started >= 1.0  # it kept trying


def test_a_host_that_listens_late_is_reached(token: Path) -> None:
    """Right after the release a rank's server may not listen yet (or, across nodes, its
    container not be routable yet): the client keeps trying for --wait seconds."""
    port = _free_port()
    late = threading.Timer(1.0, lambda: servers.append(_serve(port, token)))
    servers: list[subprocess.Popen[bytes]] = []
    late.start()
    try:
        done = _client(port, token, "echo", "late", wait=20.0)
    finally:
        late.join()
        for server in servers:
            server.wait(10)
    assert done.returncode == 0 and done.stdout == b"late\n", done.stderr


def test_frames_carry_the_output_in_order() -> None:
    """The frame format, decoded by the client's own reader from a server in a thread."""
    rsh = _module()
    a, b = socket.socketpair()
    got: list[int] = []

    def serve() -> None:
        code = rsh._serve_one(b, "t")
        got.append(code)
        b.close()

    thread = threading.Thread(target=serve)
    thread.start()
    a.sendall(json.dumps({"token": "t", "command": "printf 1; printf 2; exit 7"}).encode() + b"\n")
    data = b""
    while chunk := a.recv(4096):
        data += chunk
    thread.join(10)
    frames, at = [], 0
    while at < len(data):
        kind, size = rsh._HEADER.unpack_from(data, at)
        at += rsh._HEADER.size
        frames.append((kind, data[at : at + size]))
        at += size
    assert b"".join(d for k, d in frames if k == b"O") == b"12"
    assert frames[-1] == (b"X", (7).to_bytes(4, "big", signed=True)) and got == [7]
