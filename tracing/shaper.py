"""A bandwidth cap on the run's network: ``tc`` on the host side of each container's veth.

``./cli.py trace ... --net-bandwidth 430mbit`` caps what every container of the run receives
at that rate: a token-bucket filter (``tc qdisc ... root tbf``) on the host end of the
container's veth pair shapes the traffic the bridge sends into the container. With two
containers (a storage node and a training node) each direction of their link is capped, as a
NIC of that speed would be. Nothing is given to the containers: no ``NET_ADMIN``, no
privilege; the tracer, root on the host, shapes the host's own interfaces.

The veth's host end is found from the container's side: ``nsenter --net`` into the container's
network namespace (by its first process) and ``ip -o link show eth0`` names its peer's
interface index (``eth0@if<N>``); the host interface of that index is the one shaped.

Across the nodes of a swarm (``trace --nodes K``) the coordinator has no host side to shape:
a container's interface on the run's overlay network is one end of a veth pair whose other end
lives in the node's namespace of that network. There each node's tracer agent caps what each of
its containers *sends* (:class:`EgressShaper`): the same filter on every interface of the
container's own network namespace (``nsenter --net`` by its first process), put there before the
container is released. For a storage node and a training node that again caps each direction of
their link at the rate; with one storage node serving several training nodes, what the storage
node sends in all is capped (on one host, what each training node receives).

Removal: :meth:`Shaper.remove` deletes every qdisc it added; the runner calls it first thing
on every exit path (``tracing.runner._shutdown``: completion, failure, Ctrl-C, SIGTERM,
timeout). A tracer killed with ``kill -9`` cannot run it, but its shapers do not outlive the
run's containers either: removing a container (the next run removes orphans) deletes its veth
pair and the qdisc with it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from core.errors import SettingError, UserError

#: tc's rate units (powers of 1000, bits per second).
RATE_UNITS: Mapping[str, int] = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
}
MIN_RATE = 10**5  # 100 kbit/s: below it a burst of one MTU is a long stall
MAX_RATE = 10**12
#: The bucket: at least this many bytes (a few GSO segments) ...
MIN_BURST_BYTES = 64 * 1024
#: ... or this long at the rate, whichever is more (a timer tick at HZ 250 is 4 ms).
BURST_S = 0.004
#: How long a packet may wait in the shaper's queue before it is dropped.
LATENCY_MS = 200
CONTAINER_IFACE = "eth0"


def parse_rate(text: str) -> int:
    """A rate as tc writes them (``430mbit``, ``1gbit``, ``500kbit``) in bits per second."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in RATE_UNITS:
        raise SettingError(
            "bad {net_bandwidth} {text!r}: give a number and a unit of bits per second "
            "({units}), e.g. 430mbit",
            text=text,
            units=", ".join(RATE_UNITS),
        )
    rate = round(float(match.group(1)) * RATE_UNITS[unit])
    if not MIN_RATE <= rate <= MAX_RATE:
        raise SettingError("{net_bandwidth} {text!r} is outside 100kbit..1000gbit", text=text)
    return rate


def format_rate(bits_s: float) -> str:
    """``430 Mbit/s`` style text."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_s >= scale:
            return f"{bits_s / scale:.4g} {unit}"
    return f"{bits_s:.0f} bit/s"


def require_tc() -> None:
    """UserError unless ``tc``, ``ip`` and ``nsenter`` are installed."""
    missing = [exe for exe in ("tc", "ip", "nsenter") if shutil.which(exe) is None]
    if missing:
        raise UserError(
            f"{', '.join(missing)} not installed: --net-bandwidth needs iproute2 and util-linux "
            "(apt-get install iproute2 util-linux)"
        )


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def peer_index(pid: int, iface: str = CONTAINER_IFACE) -> int:
    """The host-side interface index of the veth whose container end is ``iface`` in the
    network namespace of process ``pid``."""
    done = _run(["nsenter", "--target", str(pid), "--net", "ip", "-o", "link", "show", iface])
    match = re.search(rf"\d+:\s+{re.escape(iface)}@if(\d+):", done.stdout)
    if done.returncode != 0 or match is None:
        why = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
        raise UserError(f"cannot find the network interface {iface} of process {pid}: {why}")
    return int(match.group(1))


def host_interface(index: int, sys_net: Path = Path("/sys/class/net")) -> str:
    """The name of the host's network interface of index ``index``."""
    for entry in sys_net.iterdir():
        try:
            if int((entry / "ifindex").read_text()) == index:
                return entry.name
        except (OSError, ValueError):
            continue
    raise UserError(f"no host network interface has index {index}")


def tbf_command(device: str, rate_bits_s: int) -> list[str]:
    """The ``tc`` command that caps ``device``'s egress at ``rate_bits_s``."""
    burst = max(MIN_BURST_BYTES, round(rate_bits_s / 8 * BURST_S))
    return [
        "tc",
        "qdisc",
        "replace",
        "dev",
        device,
        "root",
        "tbf",
        "rate",
        f"{rate_bits_s}bit",
        "burst",
        f"{burst}b",
        "latency",
        f"{LATENCY_MS}ms",
    ]


class Shaper:
    """The caps of one run: :meth:`add` one container's, :meth:`remove` them all."""

    def __init__(self, rate_bits_s: int) -> None:
        self.rate_bits_s = rate_bits_s
        self.devices: dict[str, str] = {}  # role -> shaped host interface

    def add(self, role: str, pid: int) -> str:
        """Cap what the container whose first process is ``pid`` receives; return the host
        interface shaped."""
        device = host_interface(peer_index(pid))
        done = _run(tbf_command(device, self.rate_bits_s))
        if done.returncode != 0:
            raise UserError(f"tc could not cap {device} (container {role}): {done.stderr.strip()}")
        self.devices[role] = device
        return device

    def remove(self) -> None:
        """Delete every qdisc this shaper added (one whose interface is gone went with it)."""
        errors = []
        for role, device in list(self.devices.items()):
            if not Path(f"/sys/class/net/{device}").exists():
                del self.devices[role]
                continue
            done = _run(["tc", "qdisc", "del", "dev", device, "root"])
            # A failure is one only while the cap is still there (not when the interface or
            # the qdisc went meanwhile).
            if done.returncode != 0 and " tbf " in qdisc_of(device):
                errors.append(f"{device}: {done.stderr.strip()}")
            else:
                del self.devices[role]
        if errors:
            raise UserError(f"tc could not remove the bandwidth cap: {'; '.join(errors)}")

    def describe(self) -> str:
        return format_rate(self.rate_bits_s)

    def record(self) -> dict[str, object]:
        """What the manifest records."""
        return {
            "rate_bits_s": self.rate_bits_s,
            "devices": dict(self.devices),
            "qdisc": "tbf",
            "direction": "ingress",
        }


def _in_netns(pid: int, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return _run(["nsenter", "--target", str(pid), "--net", *argv])


def netns_interfaces(pid: int) -> list[str]:
    """The network interfaces of process ``pid``'s network namespace, but loopback."""
    done = _in_netns(pid, ["ip", "-o", "link", "show"])
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit status {done.returncode}"
        raise UserError(f"cannot list the network interfaces of process {pid}: {why}")
    names = re.findall(r"^\d+:\s+([^:@\s]+)", done.stdout, flags=re.MULTILINE)
    return [name for name in names if name != "lo"]


class EgressShaper:
    """The caps of one host's containers in a run across hosts, each on what the container
    sends, in its own network namespace (module doc): :meth:`add`, :meth:`remove`."""

    def __init__(self, rate_bits_s: int) -> None:
        self.rate_bits_s = rate_bits_s
        self.shaped: dict[str, tuple[int, list[str]]] = {}  # role -> (pid, its interfaces)

    def add(self, role: str, pid: int) -> list[str]:
        """Cap what the container whose first process is ``pid`` sends, on every interface of
        its network namespace; return them."""
        devices = netns_interfaces(pid)
        if not devices:
            raise UserError(f"container {role} has no network interface to cap")
        for device in devices:
            done = _in_netns(pid, tbf_command(device, self.rate_bits_s))
            if done.returncode != 0:
                raise UserError(
                    f"tc could not cap {device} of container {role}: {done.stderr.strip()}"
                )
        self.shaped[role] = (pid, devices)
        return devices

    def remove(self) -> None:
        """Delete the caps of the containers still running (a container's namespace, and its
        caps with it, go when it exits)."""
        errors = []
        for role, (pid, devices) in list(self.shaped.items()):
            for device in devices:
                if not Path(f"/proc/{pid}").exists():
                    break
                done = _in_netns(pid, ["tc", "qdisc", "del", "dev", device, "root"])
                left = _in_netns(pid, ["tc", "qdisc", "show", "dev", device]).stdout
                if done.returncode != 0 and " tbf " in left and Path(f"/proc/{pid}").exists():
                    errors.append(f"{role} {device}: {done.stderr.strip()}")
            del self.shaped[role]
        if errors:
            raise UserError(f"tc could not remove the bandwidth cap: {'; '.join(errors)}")

    def devices(self) -> dict[str, str]:
        """Role -> its capped interfaces (comma-separated), as the manifest records them."""
        return {role: ",".join(devices) for role, (_, devices) in self.shaped.items()}


def qdisc_of(device: str) -> str:
    """``tc qdisc show dev DEVICE``'s output (tests and checks)."""
    return _run(["tc", "qdisc", "show", "dev", device]).stdout
