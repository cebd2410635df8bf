"""The daemon's decisions: `Node` and the parts it is made of, one concern per module.

`model` holds the data (settings, states, records); `node` the `Node` that composes the parts
and is the package's one entry point. The names below are the package's public surface, as
they were when it was one module.
"""

from snerd.core.node.model import (
    SECOND,
    TRANSITIONS,
    NodeConfig,
    NodePhase,
    TaskState,
    route_shard,
)
from snerd.core.node.node import Node

__all__ = ["SECOND", "TRANSITIONS", "Node", "NodeConfig", "NodePhase", "TaskState", "route_shard"]
