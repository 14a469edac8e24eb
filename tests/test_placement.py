"""Where a run's containers go across nodes (tracing/placement.py): round-robin, and compose's
``deploy.placement.constraints`` evaluated as the swarm evaluates them. The swarm itself
enforcing them is in tests/test_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.errors import UserError
from tracing.placement import Host, deal, meets, node_attributes, parse_constraint
from tracing.request import RunOptions
from tracing.swarm import service_name
from tracing.topology import service_spec


def _node(name: str, role: str = "worker", **labels: str) -> dict[str, Any]:
    """A node as `docker node inspect` describes it."""
    return {
        "ID": f"id-{name}",
        "Spec": {"Role": role, "Labels": labels},
        "Description": {
            "Hostname": name,
            "Platform": {"OS": "linux", "Architecture": "x86_64"},
            "Engine": {"Labels": {"disk": "nvme"} if name == "node-3" else {}},
        },
    }


def _hosts() -> list[Host]:
    nodes = [_node("node-1", "manager"), _node("node-2", storage="yes"), _node("node-3")]
    hosts = []
    for node in nodes:
        name = node["Description"]["Hostname"]
        hosts.append(Host(name, None, host_dir=name, swarm=True))  # type: ignore[arg-type]
        hosts[-1].attributes = node_attributes(node)
    return hosts


def test_constraints_are_parsed_and_bad_ones_are_one_line() -> None:
    assert parse_constraint("node.hostname == node-2", "x") == ("node.hostname", "==", "node-2")
    assert parse_constraint("node.labels.storage!=yes", "x") == ("node.labels.storage", "!=", "yes")
    assert parse_constraint("engine.labels.disk==nvme", "x")[0] == "engine.labels.disk"
    for bad in ("node.hostname=node-2", "node.name==x", "hostname==x", "node.role==", ""):
        with pytest.raises(UserError, match=r"^service s: .* is not a swarm placement constraint"):
            parse_constraint(bad, "service s")


def test_a_node_meets_constraints_as_the_swarm_compares() -> None:
    node = node_attributes(_node("node-2", storage="yes"))
    assert meets(node, [])
    assert meets(node, ["node.hostname==NODE-2"])  # values compare ignoring case
    assert meets(node, ["node.role==worker", "node.labels.storage==yes"])
    assert meets(node, ["node.platform.os==linux", "node.platform.arch==x86_64"])
    assert not meets(node, ["node.role==manager"])
    assert not meets(node, ["node.labels.storage!=yes"])
    assert meets(node, ["node.labels.zone!=a"])  # a label the node lacks equals nothing
    assert not meets(node, ["node.labels.zone==a"])
    assert meets(node_attributes(_node("node-3")), ["engine.labels.disk==nvme"])


def test_roles_are_dealt_round_robin_and_constrained_ones_where_they_fit() -> None:
    hosts = _hosts()
    names = lambda placed: {role: h.name for role, h in placed.items()}  # noqa: E731
    assert names(deal(["rank0", "rank1", "rank2", "rank3"], hosts)) == {
        "rank0": "node-1", "rank1": "node-2", "rank2": "node-3", "rank3": "node-1",
    }  # fmt: skip
    placed = deal(
        ["storage", "train0", "train1", "train2"],
        hosts,
        {"storage": ["node.labels.storage==yes"], "train0": [], "train1": [],
         "train2": ["node.role!=manager", "node.labels.storage!=yes"]},
    )  # fmt: skip
    assert names(placed) == {
        "storage": "node-2", "train0": "node-1", "train1": "node-2", "train2": "node-3",
    }  # fmt: skip
    # Several constrained roles spread over the nodes that fit, the least loaded first.
    placed = deal(["a", "b", "c"], hosts, dict.fromkeys("abc", ["node.role==worker"]))
    assert names(placed) == {"a": "node-2", "b": "node-3", "c": "node-2"}
    with pytest.raises(UserError, match=r"no node of the run meets x's placement constraints"):
        deal(["x"], hosts, {"x": ["node.labels.gpu==a100"]})


def test_compose_placement_constraints_reach_the_container_spec() -> None:
    service = {
        "image": "twintrace/base:latest",
        "deploy": {"placement": {"constraints": ["node.labels.storage==yes"]}},
    }
    spec = service_spec("storage", service, RunOptions(), Path("."))
    assert spec.constraints == ("node.labels.storage==yes",)
    bad = {"image": "x", "deploy": {"placement": {"constraints": ["storage=yes"]}}}
    with pytest.raises(UserError, match=r"^service s: deploy.placement.constraints: "):
        service_spec("s", bad, RunOptions(), Path("."))
    with pytest.raises(UserError, match=r"constraints must be a list"):
        service_spec("s", {"image": "x", "deploy": {"placement": {"constraints": "a"}}},
                      RunOptions(), Path("."))  # fmt: skip


def test_service_names_are_dns_labels() -> None:
    assert service_name("20261127-231934-unet3d-sleep-6c2c", "rank0") == (
        "20261127-231934-unet3d-sleep-6c2c-rank0"
    )
    long = service_name("20261127-231934-" + "a_very_long_label" * 3 + "-sleep-6c2c", "st_ore")
    assert len(long) <= 63 and "_" not in long and not long.endswith("-")


class _Nodes:
    """A manager's engine as ready_nodes reads it: ``nodes.list()`` of objects with ``attrs``."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = self
        self._nodes = nodes

    def list(self) -> list[Any]:
        return [type("N", (), {"attrs": n, "id": n["ID"]})() for n in self._nodes]


def test_the_ready_nodes_of_a_swarm_in_natural_order_with_their_addresses() -> None:
    from tracing.placement import ready_nodes

    nodes = []
    for name, state, availability in [
        ("node-10", "ready", "active"), ("node-2", "ready", "active"),
        ("node-1", "ready", "active"), ("node-3", "down", "active"),
        ("node-4", "ready", "drain"),
    ]:  # fmt: skip
        node = _node(name, "manager" if name == "node-1" else "worker")
        node["Spec"]["Availability"] = availability
        node["Status"] = {"State": state, "Addr": f"10.0.0.{name.split('-')[1]}"}
        nodes.append(node)
    nodes[2]["Status"]["Addr"] = "0.0.0.0"  # a manager may say so: its manager status tells
    nodes[2]["ManagerStatus"] = {"Addr": "10.0.0.1:2377"}
    ready = ready_nodes(_Nodes(nodes))  # type: ignore[arg-type]
    assert [(n.hostname, n.address) for n in ready] == [
        ("node-1", "10.0.0.1"), ("node-2", "10.0.0.2"), ("node-10", "10.0.0.10"),
    ]  # fmt: skip
    assert ready[0].attributes["node.role"] == "manager"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nodes": 3, "node_names": ("a", "b")}, "name each node once"),
        ({"nodes": 2, "node_names": ("a", "a")}, "name each node once"),
        # By setting name: the CLI renders them as its flags (tests/test_cli.py).
        (
            {"engine": "unix:///x.sock"},
            "^engine and registry are for runs across nodes: give nodes$",
        ),
        ({"nodes": 2, "registry": "r:5000"}, "the virtual cluster has its own"),
        ({"nodes": 2, "net_bandwidth_bits_s": 10**6, "tracing": False}, "trace the run"),
    ],
)
def test_bad_swarm_options_are_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        RunOptions(**options)


def test_nodes_by_count_or_by_name() -> None:
    from experiments.request import parse_nodes

    assert parse_nodes(None) == {} and parse_nodes("3") == {"nodes": 3} == parse_nodes(3)
    assert parse_nodes("node-3, node-1") == {"nodes": 2, "node_names": ("node-3", "node-1")}
    with pytest.raises(UserError, match="give a count"):
        parse_nodes("node-1,,node-2")
