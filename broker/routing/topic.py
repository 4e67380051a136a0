"""The topic exchange: binding keys in a trie of words (rabbit_db_topic_exchange's trie).

Keys split on "." into words; the empty key is zero words (so binding "" matches only routing
key "", and "#" matches ""), "a..b" is the three words a, "", b. In a binding key `*` is
exactly one word and `#` zero or more; in a routing key they are ordinary words.

Each node has its literal children in a dict and its `*` and `#` children in their own slots,
so a routing-key word that happens to be "*" or "#" never takes the wildcard edge twice. A
match walks only the edges the key's words select: its cost depends on the key and the trie's
shape, not on how many bindings the exchange has.

Consecutive `#` collapse on insert ("#.#" is "#"), so a `#` node never has a `#` child. Several
`#` in one key could still revisit a `#` node at the same word many times; the walk remembers,
per `#` node, the lowest word index it was entered at (every later index is then covered), which
keeps the match polynomial. That dict is only made when the trie holds a `#` at all."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.message import Message
from broker.routing.exchange import Binding, Exchange

__all__ = ["TopicExchange", "TopicTrie", "split_key"]


def split_key(key: str) -> list[str]:
    """A topic key's words; "" is no words at all, as RabbitMQ."""
    return key.split(".") if key else []


def _binding_path(key: str) -> list[str]:
    words: list[str] = []
    for w in split_key(key):
        if w == "#" and words and words[-1] == "#":
            continue  # "#.#" matches exactly what "#" does
        words.append(w)
    return words


class _Node:
    __slots__ = ("dests", "hash", "star", "words")

    def __init__(self) -> None:
        self.words: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.dests: dict[object, int] = {}  # destination -> number of bindings ending here

    def is_empty(self) -> bool:
        return not (self.dests or self.words or self.star is not None or self.hash is not None)

    def child(self, word: str) -> _Node | None:
        if word == "*":
            return self.star
        if word == "#":
            return self.hash
        return self.words.get(word)

    def add_child(self, word: str) -> _Node:
        node = _Node()
        if word == "*":
            self.star = node
        elif word == "#":
            self.hash = node
        else:
            self.words[word] = node
        return node

    def drop_child(self, word: str) -> None:
        if word == "*":
            self.star = None
        elif word == "#":
            self.hash = None
        else:
            del self.words[word]


class TopicTrie:
    """Binding keys -> destinations, with reference counts so duplicate paths share nodes."""

    __slots__ = ("_hashes", "root")

    def __init__(self) -> None:
        self.root = _Node()
        self._hashes = 0  # bindings whose key holds a "#": only then is the memo needed

    def add(self, key: str, dest: object) -> None:
        node = self.root
        path = _binding_path(key)
        for w in path:
            node = node.child(w) or node.add_child(w)
        node.dests[dest] = node.dests.get(dest, 0) + 1
        if "#" in path:
            self._hashes += 1

    def remove(self, key: str, dest: object) -> None:
        """Remove one reference; prune the nodes left with neither bindings nor children."""
        path = _binding_path(key)
        trail: list[_Node] = [self.root]
        for w in path:
            nxt = trail[-1].child(w)
            if nxt is None:
                raise KeyError(key)
            trail.append(nxt)
        leaf = trail[-1]
        n = leaf.dests[dest] - 1
        if n:
            leaf.dests[dest] = n
        else:
            del leaf.dests[dest]
        if "#" in path:
            self._hashes -= 1
        for depth in range(len(path), 0, -1):
            if not trail[depth].is_empty():
                break
            trail[depth - 1].drop_child(path[depth - 1])

    def match(self, routing_key: str) -> set[object]:
        out: set[object] = set()
        words = split_key(routing_key)
        _walk(self.root, words, 0, len(words), out, {} if self._hashes else None)
        return out

    def node_count(self) -> int:
        """Nodes in the trie, root included (1 when empty): for tests and metrics."""
        count, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.words.values())
            if node.star is not None:
                stack.append(node.star)
            if node.hash is not None:
                stack.append(node.hash)
        return count


def _walk(
    node: _Node,
    words: list[str],
    i: int,
    n: int,
    out: set[object],
    entered: dict[_Node, int] | None,
) -> None:
    h = node.hash
    if h is not None and entered is not None:
        # "#" swallows words[i:j] for every j >= i. If it was already entered at lo, all
        # indices from lo on are done; only [i, lo) is new.
        lo = entered.get(h, n + 1)
        if i < lo:
            entered[h] = i
            for j in range(i, lo):
                _walk(h, words, j, n, out, entered)
    if i == n:
        if node.dests:
            out.update(node.dests)
        return
    child = node.words.get(words[i])
    if child is not None:
        _walk(child, words, i + 1, n, out, entered)
    if node.star is not None:
        _walk(node.star, words, i + 1, n, out, entered)


class TopicExchange(Exchange):
    __slots__ = ("_trie",)
    type_name = "topic"

    def __init__(self, name: str, type: str = "topic", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self._trie = TopicTrie()

    def _add(self, binding: Binding, arguments: dict[str, Any]) -> None:
        self._trie.add(binding.routing_key, binding.destination)

    def _remove(self, binding: Binding) -> None:
        self._trie.remove(binding.routing_key, binding.destination)

    def route(self, routing_key: str, message: Message) -> Iterable[object]:
        return self._trie.match(routing_key)

    def node_count(self) -> int:
        return self._trie.node_count()
