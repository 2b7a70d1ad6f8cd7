"""The fork graph of a run's page, laid out server-side for an inline SVG (no script).

A fork tree (:class:`api.ui.views.ForkNode`) is drawn as an outline: one row
per run in depth-first order, indented one column per fork generation, with an
elbow edge from each parent down to each of its forks. The layout is plain
arithmetic here; ``_forkgraph.html`` only writes the SVG elements. At most
:data:`MAX_NODES` runs are drawn; the rest are counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiers.models import RunInfo, RunStatus

if TYPE_CHECKING:
    from api.ui.views import ForkNode

MAX_NODES = 200
"""Runs drawn in one fork graph; a bigger tree shows its first ones and a count of the rest."""

NODE_WIDTH = 200
NODE_HEIGHT = 40
COLUMN = 36  # indent per fork generation
ROW = 52  # a node and the gap below it
MARGIN = 4
LABEL_CHARS = 26  # of a run id inside a node; the full id is in the node's <title>

STATUS_FILL: dict[RunStatus, str] = {
    RunStatus.RUNNING: "#dbe7ff",
    RunStatus.PAUSED: "#fff0c2",
    RunStatus.RESUMABLE: "#dcf3e3",
    RunStatus.COMPLETED: "#cfeed8",
    RunStatus.FAILED: "#f8d4d4",
    RunStatus.CANCELLED: "#e3e3e3",
}
"""Node fill by run status: the colours of the console's status badges."""


@dataclass(frozen=True)
class GraphNode:
    """One run drawn in the graph: its box's top-left corner and what it says."""

    run: RunInfo
    x: int
    y: int
    forked_at: int | None
    current: bool
    width: int = NODE_WIDTH
    height: int = NODE_HEIGHT

    @property
    def label(self) -> str:
        """The run id, shortened to fit the box."""
        run_id = self.run.run_id
        return run_id if len(run_id) <= LABEL_CHARS else run_id[: LABEL_CHARS - 1] + "…"

    @property
    def fill(self) -> str:
        """The box's colour, by the run's status."""
        return STATUS_FILL.get(self.run.status, "#e8ebf0")


@dataclass(frozen=True)
class GraphEdge:
    """A fork: an elbow from below the parent's box to the left of the child's."""

    parent: GraphNode
    child: GraphNode

    @property
    def path(self) -> str:
        """The SVG path data of the elbow."""
        down_x = self.parent.x + COLUMN // 2
        mid_y = self.child.y + self.child.height // 2
        return f"M{down_x} {self.parent.y + self.parent.height} V{mid_y} H{self.child.x}"


@dataclass(frozen=True)
class ForkGraph:
    """A laid-out fork tree: nodes and edges, the drawing's size, and the runs left out."""

    nodes: list[GraphNode]
    edges: list[GraphEdge]
    width: int
    height: int
    hidden: int


def _preorder(node: ForkNode, depth: int = 0) -> Iterator[tuple[ForkNode, int]]:
    yield node, depth
    for child in node.children:
        yield from _preorder(child, depth + 1)


def layout(
    tree: ForkNode,
    current: str,
    forked_at: Callable[[RunInfo], int | None],
    *,
    max_nodes: int = MAX_NODES,
) -> ForkGraph:
    """Lay out ``tree`` with the run ``current`` highlighted.

    Args:
        tree: The fork tree, from its root run.
        current: The run whose page this is.
        forked_at: The seq of the parent's checkpoint a run was forked at (``None``:
            unknown, or the root); called only for the runs drawn.
        max_nodes: Runs drawn at most (depth-first from the root).
    """
    order = list(_preorder(tree))
    drawn: dict[int, GraphNode] = {}
    edges = []
    parents: dict[int, ForkNode] = {
        id(child): parent for parent, _ in order for child in parent.children
    }
    for row, (node, depth) in enumerate(order[:max_nodes]):
        info = node.run
        placed = GraphNode(
            run=info,
            x=MARGIN + depth * COLUMN,
            y=MARGIN + row * ROW,
            forked_at=forked_at(info) if info.parent_run_id is not None else None,
            current=info.run_id == current,
        )
        drawn[id(node)] = placed
        parent = parents.get(id(node))
        if parent is not None:
            edges.append(GraphEdge(drawn[id(parent)], placed))
    nodes = list(drawn.values())
    width = max(n.x for n in nodes) + NODE_WIDTH + MARGIN
    height = max(n.y for n in nodes) + NODE_HEIGHT + MARGIN
    return ForkGraph(nodes, edges, width, height, len(order) - len(nodes))
