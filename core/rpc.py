"""Options shared by the project's gRPC channels (the coordinator's to each tracer agent, a
SOPHON training node's to its storage node)."""

from __future__ import annotations

#: gRPC's channel waits 1 s before dialling again after a refused connection, and longer after
#: each further refusal (up to 2 min). A channel's first call often reaches a server that is
#: still starting (the agent's container, the storage node's): the coordinator's first Hello
#: was answered about 0.7 s after the agent was up. These dial again every 0.1 s, at most 1 s
#: apart.
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
