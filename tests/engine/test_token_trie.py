"""The token trie under the prefix cache: edges split where prompts part, empty paths folded back, walks in order."""

from __future__ import annotations

from engine.token_trie import Node, common, first_at, first_below, held_depth, node_at, prune_path


def test_a_node_per_branch_not_per_token_and_empty_paths_fold_back() -> None:
    root = Node(None, ())
    a = node_at(root, (1, 2, 3, 4))
    a.entry = "a"
    b = node_at(root, (1, 2, 9))
    b.entry = "b"
    split = root.children[1]
    assert split.edge == (1, 2) and set(split.children) == {3, 9} and a.edge == (3, 4)
    assert node_at(root, (1, 2, 3, 4)) is a  # found again, nothing made
    b.entry = None
    prune_path(b)  # b's leaf goes, and the split node folds into a
    assert list(root.children.values()) == [a] and a.edge == (1, 2, 3, 4) and a.parent is root


def test_walks_take_the_first_accepted_entry_in_insertion_order() -> None:
    root = Node(None, ())
    for tokens, entry in (((5, 1), "first"), ((5, 2), "second"), ((5, 2, 7), "deeper")):
        node_at(root, tokens).entry = entry
    assert first_below(root, lambda e: True) == "first"
    assert first_below(root, lambda e: e != "first") == "second"
    assert first_at(root.children[5], lambda e: e == "deeper") == "deeper"
    assert first_below(root, lambda e: False) is None
    assert common((1, 2, 3), [0, 1, 2, 4], 1, 4) == 2


def test_held_depth_is_the_deepest_entry_on_the_path_or_branch_with_a_longer_entry_beside_it() -> None:
    # what a prefix-cache put stores anew starts there (usage's cache_write_tokens)
    root = Node(None, ())
    node_at(root, (1, 2)).entry = "short"
    node_at(root, (1, 2, 3, 4, 5)).entry = "long"
    assert held_depth(node_at(root, (1, 2, 3, 9)), 4, lambda e: e == "long") == 3  # shares 1 2 3 with "long"
    assert held_depth(node_at(root, (1, 2, 3, 8)), 4, lambda e: False) == 2  # none trimmable: "short" on the path
    assert held_depth(node_at(root, (7, 7)), 2, lambda e: True) == 0
    assert held_depth(node_at(root, (1, 2, 3, 4)), 4, lambda e: e == "long") == 4  # below the node itself
