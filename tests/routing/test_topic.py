from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.routing import TopicExchange, TopicTrie, make_exchange
from broker.routing.topic import split_key

from .helpers import Q, msg


def matches(binding_key: str, routing_key: str) -> bool:
    x = make_exchange("t", "topic")
    q = Q("q")
    x.bind(q, binding_key)
    return q in set(x.route(routing_key, msg(routing_key)))


def test_split_key() -> None:
    assert split_key("") == []
    assert split_key("a") == ["a"]
    assert split_key("a..b") == ["a", "", "b"]
    assert split_key(".") == ["", ""]


@pytest.mark.parametrize(
    ("binding", "key", "expected"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.b", "a.b.c", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
        ("a.*.c", "a.b.b.c", False),
        ("*", "a", True),
        ("*", "", False),  # "" is no words at all
        ("*", "a.b", False),
        ("*.*", "a.b", True),
        ("#", "", True),
        ("#", "a", True),
        ("#", "a.b.c", True),
        ("#.#", "", True),
        ("#.#", "a.b", True),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "b.a", False),
        ("#.a", "a", True),
        ("#.a", "x.y.a", True),
        ("#.a", "a.x", False),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y", False),
        ("a.#.b", "a.b.x", False),
        ("a.#.b", "a.b.b", True),
        ("#.*", "", False),
        ("#.*", "a", True),
        ("*.#", "a.b", True),
        ("#.b.#", "a.b.c", True),
        ("#.b.#", "b", True),
        ("#.b.#", "a.c", False),
        ("", "", True),  # binding key "" matches only routing key ""
        ("", "a", False),
        ("", ".", False),
        ("a..b", "a..b", True),
        ("a..b", "a.b", False),
        ("a.*.b", "a..b", True),  # the empty word is a word
        ("*", ".", False),
        ("*.*", ".", True),
        (".", ".", True),
        ("a.", "a.", True),
        ("a.", "a", False),
        ("#", ".", True),
        ("a.*", "a.*", True),  # "*" in a routing key is an ordinary word
        ("a.b", "a.*", False),
        ("a.b", "a.#", False),
        ("a.#", "a.#", True),
        ("a*", "ab", False),  # wildcards are whole words only
        ("a*", "a*", True),
    ],
)
def test_topic_rules(binding: str, key: str, expected: bool) -> None:
    assert matches(binding, key) is expected
    assert reference(binding, key) is expected  # the property test's oracle agrees too


def test_many_bindings_one_copy_each() -> None:
    x = make_exchange("t", "topic")
    q1, q2 = Q("1"), Q("2")
    for key in ("#", "a.#", "*.b", "a.b", "#.b", "a.*"):
        x.bind(q1, key)
    x.bind(q2, "a.c")
    assert x.route("a.b", msg("a.b")) == {q1}
    assert x.route("a.c", msg("a.c")) == {q1, q2}


def test_unbind_one_of_shared_paths_keeps_the_other() -> None:
    x = make_exchange("t", "topic")
    q1, q2 = Q("1"), Q("2")
    x.bind(q1, "a.b")
    x.bind(q2, "a.b")
    x.bind(q1, "a.b", {"x": 1})
    x.unbind(q1, "a.b")
    assert x.route("a.b", msg("a.b")) == {q1, q2}
    x.unbind(q1, "a.b", {"x": 1})
    assert x.route("a.b", msg("a.b")) == {q2}


def test_unbind_prunes_the_trie() -> None:
    x = make_exchange("t", "topic")
    assert isinstance(x, TopicExchange)
    q1, q2 = Q("1"), Q("2")
    assert x.node_count() == 1
    x.bind(q1, "a.b.c")
    x.bind(q1, "a.b")
    x.bind(q2, "a.*.#")
    x.bind(q2, "#.#.x")  # stored as "#.x"
    x.bind(q1, "")
    assert x.node_count() == 1 + 3 + 2 + 2
    x.unbind(q1, "a.b.c")
    assert x.node_count() == 1 + 2 + 2 + 2  # "c" went, "a.b" still holds q1
    x.unbind_all(q2)
    assert x.node_count() == 3
    x.unbind(q1, "a.b")
    x.unbind(q1, "")
    assert x.node_count() == 1
    assert x.route("a.b", msg("a.b")) == set()


def test_many_hashes_stay_fast() -> None:
    """Several '#' against a long key would explode without the per-node memo."""
    x = make_exchange("t", "topic")
    q = Q("q")
    x.bind(q, ".".join(["#", "a"] * 12 + ["z"]))
    key = ".".join(["a"] * 100)
    assert x.route(key, msg(key)) == set()
    assert x.route(key + ".z", msg()) == {q}


# -- property test: the trie against a regex built from the binding key --------------------------
def reference(binding_key: str, routing_key: str) -> bool:
    """Each word becomes 'word.'; '*' is one such unit, '#' any number of them."""
    parts = []
    for w in split_key(binding_key):
        if w == "*":
            parts.append(r"[^.]*\.")
        elif w == "#":
            parts.append(r"(?:[^.]*\.)*")
        else:
            parts.append(re.escape(w) + r"\.")
    subject = "".join(w + "." for w in split_key(routing_key))
    return re.fullmatch("".join(parts), subject) is not None


binding_words = st.sampled_from(["a", "b", "c", "", "*", "#"])
key_words = st.sampled_from(["a", "b", "c", "", "*", "#"])
binding_keys = st.lists(binding_words, max_size=6).map(".".join)
routing_keys = st.lists(key_words, max_size=7).map(".".join)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(binding_keys, min_size=1, max_size=25), st.lists(routing_keys, min_size=1, max_size=10)
)
def test_trie_agrees_with_regex_reference(bindings: list[str], keys: list[str]) -> None:
    trie = TopicTrie()
    for i, b in enumerate(bindings):
        trie.add(b, i)
    for key in keys:
        expected = {i for i, b in enumerate(bindings) if reference(b, key)}
        assert trie.match(key) == expected, key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(binding_keys, st.integers(0, 3)), max_size=25), st.randoms())
def test_unbinding_everything_leaves_only_the_root(bindings: list[tuple[str, int]], rnd) -> None:  # type: ignore[no-untyped-def]
    x = make_exchange("t", "topic")
    assert isinstance(x, TopicExchange)
    added = [(k, d) for k, d in bindings if x.bind(d, k)]
    rnd.shuffle(added)
    for k, d in added[: len(added) // 2]:
        assert x.unbind(d, k)
    # what is left still routes as the reference says
    left = added[len(added) // 2 :]
    for key in ("", "a", "a.b", "b.c.a", "."):
        assert x.route(key, msg(key)) == {d for k, d in left if reference(k, key)}
    for k, d in left:
        assert x.unbind(d, k)
    assert x.node_count() == 1
    assert not x.has_bindings()


def test_bench_setup_routes_the_expected_queues() -> None:
    from hare_bench.bench_routing import topic_exchange

    x = topic_exchange(100)
    assert x.route("stock.S1.nyse", msg()) == {"q5", "q6", "q7", "hash-all"}
    # "#.S1" (q9) and "*.S2.#" (q12); "stock.#.S1" (q8) needs the "stock" prefix
    assert x.route("other.S2.x.S1", msg()) == {"q9", "q12", "hash-all"}
