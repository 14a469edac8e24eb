#!/usr/bin/env python3
"""twintrace-rsh: the remote shell of MPI ranks in containers, without ssh.

Open MPI's launcher (PRRTE) starts its daemon on every other host of a job through a remote
shell, ``ssh HOST COMMAND`` by default (``plm_ssh_agent``). The DLIO ranks of a run in
containers (``trace --variant dlio --rank-containers``, on one host or across the nodes of a
swarm: docs/dlio.md, docs/cluster.md) have no ssh: rank 0's container runs ``mpirun`` with this
program as its agent, and every other rank's container runs it as a server (``--serve``), its
first process, on the run's private network.

- ``twintrace-rsh HOST COMMAND...``: connects to HOST's server, sends the command (its words
  joined by spaces, as ssh sends them, run there by ``/bin/sh -c``) with the run's token, copies
  what the command writes to its own stdout and stderr, and exits with the command's exit code
  (255 when the server cannot be reached within ``--wait`` seconds, 60, or the connection
  ends first, as ssh does).
- ``twintrace-rsh --serve``: accepts connections until one presents the token, runs its
  command (stdin: /dev/null), sends its output and exit code, and exits with that code: the
  container ends as its MPI daemon does. A client that goes away kills the command, and the
  server exits 0: the launcher ended the session (mpirun closes its remote shells when the job
  is over, the daemons' own exit still under way), so the job's outcome is the launcher's exit
  code, in rank 0's container. No connection with the token within ``--wait`` seconds: exit 1.

The token is a random secret of the run, in a file the coordinator gives every rank's container
(``--token-file``, read-only); the network is the run's own (internal: no route out), so a
command comes only from a container of the run. Standard library only: it runs in the ``dlio``
image beside DLIO and Open MPI.

Frames from server to client: one byte (``O`` stdout, ``E`` stderr, ``X`` exit code), four bytes
of length (big-endian), then the data (for ``X``: the exit code as a signed 4-byte integer).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

PORT = 7022
TOKEN_FILE = "/twintrace/ctl/rsh.token"
#: ssh's exit status when it could not run the command.
FAILED = 255
_HEADER = struct.Struct(">cI")


def _token(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the connection ended")
        data += chunk
    return data


def _read_line(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the connection ended")
        data += chunk
        if len(data) > limit:
            raise ConnectionError("request too long")
    return data


def _connect(host: str, port: int, wait_s: float) -> socket.socket:
    """A connection to ``host:port``, tried again every 0.2 s for up to ``wait_s`` seconds:
    right after the release the host's name may not resolve yet, its server may not listen
    yet, and across the nodes of a swarm its node may not have learnt yet where the other
    nodes' containers are (`No route to host` until the swarm's gossip reaches it,
    docs/cluster.md). The last OSError once the time is up."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=10)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def client(host: str, words: Sequence[str], token_file: str, port: int, wait_s: float) -> int:
    """Run ``words`` on ``host``'s server; its exit code."""
    try:
        sock = _connect(host, port, wait_s)
        sock.settimeout(None)
    except OSError as exc:
        print(
            f"twintrace-rsh: cannot reach {host}:{port} within {wait_s:g} s: {exc}",
            file=sys.stderr,
        )
        return FAILED
    with sock:
        request = {"token": _token(token_file), "command": " ".join(words)}
        sock.sendall(json.dumps(request).encode() + b"\n")
        sinks = {b"O": sys.stdout.buffer, b"E": sys.stderr.buffer}
        try:
            while True:
                kind, size = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
                data = _recv_exact(sock, size)
                if kind == b"X":
                    return struct.unpack(">i", data)[0]
                sink = sinks.get(kind)
                if sink is not None:
                    sink.write(data)
                    sink.flush()
        except ConnectionError:
            print(f"twintrace-rsh: the connection to {host} ended early", file=sys.stderr)
            return FAILED


def _serve_one(conn: socket.socket, token: str) -> int | None:
    """Run the command of one connection; its exit code, or None when the token was wrong."""
    try:
        request = json.loads(_read_line(conn))
        given = str(request.get("token", ""))
        command = str(request["command"])
    except (ConnectionError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not hmac.compare_digest(given.encode(), token.encode()):
        return None
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    lock = threading.Lock()

    def send(kind: bytes, data: bytes) -> None:
        with lock:
            try:
                conn.sendall(_HEADER.pack(kind, len(data)) + data)
            except OSError:
                pass

    def relay(stream: object, kind: bytes) -> None:
        for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):  # type: ignore[attr-defined]
            send(kind, chunk)

    abandoned = threading.Event()

    def watch() -> None:  # the client went away: so does the command
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        if proc.poll() is None:
            abandoned.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    relays = [
        threading.Thread(target=relay, args=(proc.stdout, b"O"), daemon=True),
        threading.Thread(target=relay, args=(proc.stderr, b"E"), daemon=True),
    ]
    for thread in relays:
        thread.start()
    threading.Thread(target=watch, daemon=True).start()
    code = proc.wait()
    for thread in relays:
        thread.join()
    send(b"X", struct.pack(">i", code))
    try:  # ends the watch's recv and tells the client the stream is over
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    if abandoned.is_set():
        print(
            "twintrace-rsh: the launcher closed the session: its command was stopped",
            file=sys.stderr,
        )
        return 0
    return code


def serve(port: int, token_file: str, wait_s: float) -> int:
    """Serve until one command with the token has run; its exit code (module doc)."""
    token = _token(token_file)
    with socket.create_server(("", port), reuse_port=False) as server:
        server.settimeout(wait_s)
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                print(f"twintrace-rsh: no launch came within {wait_s:.0f} s", file=sys.stderr)
                return 1
            with conn:
                conn.settimeout(None)
                code = _serve_one(conn, token)
            if code is not None:
                return 128 - code if code < 0 else code  # killed by a signal: 128 + N


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twintrace-rsh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="run as a rank's server")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--token-file", default=TOKEN_FILE)
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        help="seconds to wait: --serve, for a launch (600); else, to reach the host (60)",
    )
    parser.add_argument("host", nargs="?")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if opts.serve:
        return serve(opts.port, opts.token_file, 600.0 if opts.wait is None else opts.wait)
    if not opts.host or not opts.command:
        parser.error("give a host and a command (or --serve)")
    wait_s = 60.0 if opts.wait is None else opts.wait
    return client(opts.host, opts.command, opts.token_file, opts.port, wait_s)


if __name__ == "__main__":
    sys.exit(main())
