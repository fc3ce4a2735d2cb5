"""A path-compressed token trie: the structure under the prefix cache (engine/prefix_cache.py).

A node's edge holds the run of tokens from its parent, so nodes exist only where entries sit or prompts branch. A node
per token (with its children dict) made every cached token two objects Python's collector walks in each full
collection: 27–51 ms pauses of the whole server under 64 streams. Children keep insertion order, so walks are
deterministic.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["Node", "common", "first_at", "first_below", "held_depth", "node_at", "prune_path"]


class Node:
    __slots__ = ("children", "parent", "edge", "entry")

    def __init__(self, parent: "Node | None", edge: tuple[int, ...]) -> None:
        self.children: dict[int, Node] = {}  # keyed by the first token of the child's edge
        self.parent = parent
        self.edge = edge  # the tokens from the parent to this node (empty for a root)
        self.entry: Any = None


def common(a: tuple[int, ...], b: Sequence[int], start: int, limit: int) -> int:
    """How many leading tokens of edge `a` equal b[start:limit]."""
    n = min(len(a), limit - start)
    if tuple(b[start:start + n]) == a[:n]:
        return n
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


def node_at(root: Node, tokens: tuple[int, ...]) -> Node:
    """The node at exactly `tokens` below `root`: made, and an edge split there, when needed."""
    node, depth = root, 0
    while depth < len(tokens):
        child = node.children.get(tokens[depth])
        if child is None:
            leaf = node.children[tokens[depth]] = Node(node, tokens[depth:])
            return leaf
        matched = common(child.edge, tokens, depth, len(tokens))
        if matched < len(child.edge):
            # Split the edge where the tokens end or part: the new node takes the child's place (and its position
            # among the parent's children, so walk order stays insertion order).
            mid = Node(node, child.edge[:matched])
            node.children[tokens[depth]] = mid
            child.edge, child.parent = child.edge[matched:], mid
            mid.children[child.edge[0]] = child
            child = mid
        node, depth = child, depth + matched
    return node


def prune_path(node: Node) -> None:
    """Remove now-empty leaves up to the first node that still holds an entry or children, then fold a node left with
    no entry and one child into that child (the trie stays path-compressed)."""
    while node.parent is not None and node.entry is None and not node.children:
        parent = node.parent
        del parent.children[node.edge[0]]
        node = parent
    if node.parent is not None and node.entry is None and len(node.children) == 1:
        (child,) = node.children.values()
        child.edge, child.parent = node.edge + child.edge, node.parent
        node.parent.children[node.edge[0]] = child


def first_below(node: Node, accept: Callable[[Any], bool]) -> Any:
    """The first accepted entry strictly below `node`, depth first in insertion order (independent of sessions)."""
    return _first_of(list(reversed(node.children.values())), accept)


def first_at(node: Node, accept: Callable[[Any], bool]) -> Any:
    """The first accepted entry at `node` or below it (a walk stopped inside its edge)."""
    return _first_of([node], accept)


def held_depth(node: Node, depth: int, longer: Callable[[Any], bool]) -> int:
    """How many leading tokens of the path to `node` (`depth` tokens) the trie's entries hold: those of the deepest
    entry on the path, or up to the deepest node with a `longer` entry (one a lookup trims) off the path below it.
    Walks up from `node`; a branch's search stops at its first accepted entry (every leaf holds an entry)."""
    below: Node | None = None  # the child the walk came up from: its subtree is on the path
    current: Node | None = node
    while current is not None and depth > 0:
        if current.entry is not None:
            return depth
        if _first_of([c for c in reversed(current.children.values()) if c is not below], longer) is not None:
            return depth
        below, depth, current = current, depth - len(current.edge), current.parent
    return 0


def _first_of(stack: list[Node], accept: Callable[[Any], bool]) -> Any:
    while stack:
        current = stack.pop()
        if current.entry is not None and accept(current.entry):
            return current.entry
        stack.extend(reversed(current.children.values()))
    return None
