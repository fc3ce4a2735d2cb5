"""Prefix cache: a token trie of KV snapshots under a byte budget.

The trie is path-compressed (engine/token_trie.py): nodes exist only where entries sit or prompts branch.

A row's KV state is a list (one per layer) of mlx-lm cache objects. `put` stores a materialized snapshot under the
exact token sequence it covers, sharing the KV blocks of the prefix it has in common with other entries
(engine/kv_blocks.py); `take` finds the longest cached prefix of a new prompt (trimming a longer trimmable entry) and
hands back caches the caller may mutate freely. Session ids only choose where the trie walk starts; they never change
what `take` returns. All methods are meant to run on the engine thread.

Segmented LRU (the budget counts each shared block once): a new entry is on probation, in a segment of at most
`PROBATION_SHARE` of the budget (it always holds the newest entry); a hit promotes it to the protected rest. One-shot
prompts (a script's requests, a soak) thus churn through the small segment instead of filling the whole budget and
pushing out the conversations that come back. A put by a session (an affinity header, `prompt_cache_key`) or one
extending a protected entry (a conversation's next turn) starts protected.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import mlx.core as mx

from engine.kv_blocks import BLOCK_TOKENS, BlockStore, StoredKV
from engine.token_trie import Node, common, first_at, first_below, held_depth, node_at, prune_path

__all__ = ["PROBATION_SHARE", "PrefixCache"]

PROBATION_SHARE = 0.125  # of the budget, for entries never hit yet

@dataclass(eq=False)
class _Entry:
    namespace: str
    tokens: tuple[int, ...]
    node: Node
    kv: StoredKV
    nbytes: int  # charged to its segment: what its put added (a shared block stays charged to the entry that made it)
    trimmable: bool
    system: bool
    key: int
    sessions: set[str] = field(default_factory=set)
    protected: bool = False  # hit since its put, or put by a session or a protected entry's continuation
    # The thread whose stream still owes this entry's copies (started by `put`, not yet waited for), else None.
    # MLX's per-thread streams (CUDA) let no other thread evaluate on top of them until that thread `settle`s.
    owner: int | None = None


def _usable(entry: _Entry | None) -> bool:
    me = threading.get_ident()
    return entry is not None and entry.owner in (None, me) and all(b.owner in (None, me) for b in entry.kv.waits)


def _takeable(entry: _Entry) -> bool:
    """A longer entry a lookup may trim to its prefix."""
    return entry.trimmable and _usable(entry)


class PrefixCache:
    """Token trie of KV snapshots per namespace (model + adapter), segmented LRU under a byte budget.

    System-prefix entries are evicted only after every other entry. A `max_bytes` of 0 disables
    the cache (`take` always misses, `put` stores nothing).
    """

    def __init__(self, max_bytes: int, probation_share: float = PROBATION_SHARE,
                 block_tokens: int = BLOCK_TOKENS) -> None:
        """Raises ValueError when max_bytes is negative, probation_share is outside (0, 1] or block_tokens < 1."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if not 0 < probation_share <= 1:
            raise ValueError("probation_share must be in (0, 1]")
        self.max_bytes = max_bytes
        self.probation_max_bytes = int(max_bytes * probation_share)
        self._roots: dict[str, Node] = {}
        self._store = BlockStore(block_tokens)  # the entries' shared KV blocks (engine/kv_blocks.py)
        # Eviction order: probation (closed sessions' entries first), then protected entries, then system prefixes.
        self._probation: OrderedDict[int, _Entry] = OrderedDict()
        self._probation_bytes = 0
        self._lru: OrderedDict[int, _Entry] = OrderedDict()  # the protected segment
        self._system: OrderedDict[int, _Entry] = OrderedDict()
        self._keys = itertools.count()
        self._sessions: dict[str, _Entry] = {}
        self._lock = threading.RLock()
        # Entries whose copies a thread started and has not waited for, by thread: [put since its last settle,
        # put before that] (see `settle`).
        self._pending: dict[int, list[list[_Entry]]] = {}
        # Copies a thread's puts hold back until it leaves `copies_held`, by thread.
        self._held: dict[int, list[mx.array]] = {}
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._hit_tokens = 0
        self._evictions = 0
        self._promotions = 0

    # -- lookup -------------------------------------------------------------------------------

    def take(self, namespace: str, tokens: Sequence[int], session_id: str | None = None) -> tuple[int, list | None]:
        """Longest usable cached prefix of `tokens`, strictly shorter than `tokens`.

        Returns (n, kv) where kv is a fresh per-layer cache list with offset n that the caller
        may mutate, or (0, None) on a miss. Never raises for unknown namespaces or sessions.
        """
        with self._lock:
            tokens = tuple(tokens)
            limit = len(tokens) - 1
            root = self._roots.get(namespace)
            if self.max_bytes == 0 or root is None or limit <= 0:
                self._misses += 1
                return 0, None
            node, depth = self._walk_start(root, namespace, tokens, limit, session_id)
            best: _Entry | None = node.entry if _usable(node.entry) else None
            inside: Node | None = None  # the child whose edge the walk stopped inside of
            while depth < limit:
                child = node.children.get(tokens[depth])
                if child is None:
                    break
                matched = common(child.edge, tokens, depth, limit)
                if matched < len(child.edge):
                    inside, depth = child, depth + matched
                    break
                node, depth = child, depth + matched
                if _usable(node.entry):
                    best = node.entry
            best_len = len(best.tokens) if best is not None else 0
            if depth > best_len:
                longer = first_below(node, _takeable) if inside is None else first_at(inside, _takeable)
                if longer is not None:
                    best, best_len = longer, depth
            if best is None or best_len == 0:
                self._misses += 1
                return 0, None
            self._touch(best, promote=True)
            if session_id is not None:
                self._bind_session(session_id, best)
            kv = self._store.restore(best.kv, len(best.tokens), best_len, room=len(tokens) - best_len)
            self._hits += 1
            self._hit_tokens += best_len
            return best_len, kv

    def settle(self, *, keep_latest: bool = False) -> int:
        """Wait for the copies this thread's puts started, so any thread may take those entries (until then
        `take` passes over them on other threads). `keep_latest`: only those put before the last call; a pipelined
        engine thread settles once a step later, when the step its copies queued behind has been read anyway.
        Returns the entries settled. Raises what evaluating them raises."""
        me = threading.get_ident()
        with self._lock:
            lists = self._pending.get(me)
            if lists is None:
                return 0
            latest, older = lists
            due = older + ([] if keep_latest else latest)
            if keep_latest:
                lists[:] = [[], latest]
            else:
                del self._pending[me]
        if due:
            mx.eval([a for e in due for a in e.kv.fresh])  # an evicted entry's too: blocks it made may live on
        with self._lock:
            for e in due:
                e.owner = None
                e.kv.settled()
        return len(due)

    @contextmanager
    def copies_held(self) -> Iterator[None]:
        """This thread's puts inside start their copies on leaving, not as they put: a copy of KV a built but unstarted
        step writes computes that step, which on a CPU `async_eval` waits for (engine/step.py hands the row's last
        delta over first). The entries count from the put as usual. Raises what starting the copies raises."""
        me = threading.get_ident()
        held: list[mx.array] = []
        self._held[me] = held
        try:
            yield
        finally:
            del self._held[me]
            if held:
                mx.async_eval(held)

    def has_pending(self) -> bool:
        """Whether some thread has entries to settle. Raises nothing."""
        with self._lock:
            return any(latest or older for latest, older in self._pending.values())

    def _walk_start(
        self, root: Node, namespace: str, tokens: tuple[int, ...], limit: int, session_id: str | None
    ) -> tuple[Node, int]:
        # Affinity: when the session's last entry is a prefix of the prompt, resume the walk at
        # its node (one C-speed tuple compare instead of a dict lookup per token). Same result.
        entry = self._sessions.get(session_id) if session_id is not None else None
        if entry is not None and entry.namespace == namespace and entry.node.entry is entry:
            n = len(entry.tokens)
            if n <= limit and tokens[:n] == entry.tokens:
                return entry.node, n
        return root, 0

    # -- insertion ----------------------------------------------------------------------------

    def put(
        self,
        namespace: str,
        tokens: Sequence[int],
        kv: list,
        session_id: str | None = None,
        *,
        system_prefix: bool = False,
    ) -> range:
        """Store a snapshot of `kv` as the state after `tokens`; returns the positions it newly stored: the new entry's
        tokens past those the cache held already (an entry on their path, or a longer trimmable one), else empty.

        If the KV covers more positions than `tokens` (a chunk ran past a segment boundary), the snapshot is cut to
        len(tokens); if it covers fewer (the last sampled token was never fed), it is stored under the tokens it
        covers. An entry larger than the whole budget is skipped, and so is KV that covers more tokens but cannot be
        cut (a hybrid model's recurrent state past them). Raises nothing of its own.
        """
        with self._lock:
            if self.max_bytes == 0 or not kv:
                return range(0)
            tokens = tuple(tokens)
            offsets = [getattr(layer, "offset", None) for layer in kv]
            covered = min((o for o in offsets if isinstance(o, int)), default=len(tokens))
            if covered < len(tokens):
                tokens = tokens[:covered]
            if not tokens:
                return range(0)
            trimmable = all(layer.is_trimmable() for layer in kv)
            if covered > len(tokens) and not trimmable:
                return range(0)  # a state past the tokens would answer for them wrongly (a row that left mid-step)
            node = node_at(self._roots.setdefault(namespace, Node(None, ())), tokens)
            existing = node.entry
            if existing is not None:
                existing.system = existing.system or system_prefix
                self._requeue(existing)
                if session_id is not None:
                    self._bind_session(session_id, existing)
                return range(0)
            if trimmable and not system_prefix:
                dominating = first_below(node, _takeable)
                if dominating is not None:
                    # A longer trimmable entry already serves every lookup this one would.
                    prune_path(node)
                    self._touch(dominating)
                    if session_id is not None:
                        self._bind_session(session_id, dominating)
                    return range(0)
            me = threading.get_ident()
            stored = self._store.snapshot(namespace, tokens, kv, me)
            if stored.total > self.max_bytes:
                self._store.release(stored)
                prune_path(node)
                return range(0)
            known = held_depth(node, len(tokens), lambda e: e.trimmable)  # before the new entry, whoever owns them
            arrays = stored.fresh
            # Started, not waited for: a put comes mid-step, with the next step already in flight; waiting here
            # held the engine thread for that whole step (H200: half the puts made a decode iteration slow).
            # The copies run in stream order, and the sizes are known from the shapes.
            if (held := self._held.get(me)) is not None:
                held.extend(arrays)
            elif arrays:
                mx.async_eval(arrays)
            entry = _Entry(namespace, tokens, node, stored, stored.added, trimmable, system_prefix, next(self._keys),
                           owner=me, protected=session_id is not None or self._continues_protected(node))
            self._pending.setdefault(me, [[], []])[0].append(entry)
            node.entry = entry
            self._bytes += stored.added
            self._requeue(entry)
            if trimmable:
                self._drop_dominated_ancestors(node)
            if session_id is not None:
                self._bind_session(session_id, entry)
            self.reclaim()
            return range(known, len(tokens)) if node.entry is entry else range(0)  # unless evicted at once

    @staticmethod
    def _continues_protected(node: Node) -> bool:
        """Whether the nearest entry above `node` (system prefixes aside) is protected: a conversation's next turn."""
        current = node.parent
        while current is not None:
            entry = current.entry
            if entry is not None and not entry.system:
                return entry.protected
            current = current.parent
        return False

    def _drop_dominated_ancestors(self, node: Node) -> None:
        current = node.parent
        while current is not None:
            entry = current.entry
            if entry is not None and entry.trimmable and not entry.system:
                self._remove(entry)
            current = current.parent

    # -- eviction -----------------------------------------------------------------------------

    def close_session(self, session_id: str) -> None:
        """Forget the session's affinity; its entries become the first to be evicted. Never raises."""
        with self._lock:
            entry = self._sessions.pop(session_id, None)
            if entry is None:
                return
            entry.sessions.discard(session_id)
            if not entry.sessions and not entry.system and entry.node.entry is entry:
                self._dequeue(entry)
                entry.protected = False
                self._enqueue(entry)
                self._probation.move_to_end(entry.key, last=False)

    def reclaim(self) -> int:
        """Evict entries until the byte budget and the probation segment's share hold: probation first (its
        newest entry last of all), then protected entries, system prefixes last; returns how many went.
        Never raises."""
        evicted = 0
        with self._lock:
            while True:
                over = self._bytes > self.max_bytes
                if len(self._probation) > 1 and (over or self._probation_bytes > self.probation_max_bytes):
                    queue = self._probation
                elif over and (self._lru or self._system or self._probation):
                    queue = self._lru or self._system or self._probation
                else:
                    break
                entry = next(iter(queue.values()))
                self._evictions += 1
                evicted += 1
                self._remove(entry)
        return evicted

    def clear(self) -> None:
        """Drop every entry (e.g. when the model is unloaded). Never raises."""
        with self._lock:
            for entry in [*self._probation.values(), *self._lru.values(), *self._system.values()]:
                self._remove(entry)

    def stats(self) -> dict:
        """Counters for /stats: hits, misses, hit_tokens, bytes, max_bytes, entries, evictions."""
        with self._lock:
            return {
                "hits": self._hits,
                "misses": self._misses,
                "hit_tokens": self._hit_tokens,
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "entries": len(self._probation) + len(self._lru) + len(self._system),
                "system_entries": len(self._system),
                "evictions": self._evictions,
                "probation_bytes": self._probation_bytes,
                "promotions": self._promotions,
            }

    # -- bookkeeping --------------------------------------------------------------------------

    def _queue_of(self, entry: _Entry) -> OrderedDict[int, _Entry]:
        return self._system if entry.system else self._lru if entry.protected else self._probation

    def _dequeue(self, entry: _Entry) -> None:
        if self._probation.pop(entry.key, None) is not None:
            self._probation_bytes -= entry.nbytes
        self._lru.pop(entry.key, None)
        self._system.pop(entry.key, None)

    def _enqueue(self, entry: _Entry) -> None:
        queue = self._queue_of(entry)
        queue[entry.key] = entry
        if queue is self._probation:
            self._probation_bytes += entry.nbytes

    def _requeue(self, entry: _Entry) -> None:
        self._dequeue(entry)
        self._enqueue(entry)

    def _touch(self, entry: _Entry, *, promote: bool = False) -> None:
        """Most recently used; `promote` (a hit): out of probation into the protected segment."""
        if promote and not entry.system and not entry.protected:
            entry.protected = True
            self._promotions += 1
            self._requeue(entry)
        else:
            self._queue_of(entry).move_to_end(entry.key)

    def _bind_session(self, session_id: str, entry: _Entry) -> None:
        previous = self._sessions.get(session_id)
        if previous is not None:
            previous.sessions.discard(session_id)
        self._sessions[session_id] = entry
        entry.sessions.add(session_id)

    def _remove(self, entry: _Entry) -> None:
        self._dequeue(entry)
        for session_id in entry.sessions:
            if self._sessions.get(session_id) is entry:
                del self._sessions[session_id]
        entry.sessions.clear()
        self._bytes -= self._store.release(entry.kv)  # its own bytes and the blocks no other entry refers to
        entry.node.entry = None
        prune_path(entry.node)
