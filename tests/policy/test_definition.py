"""broker.policy without a broker: validation with RabbitMQ 3.10.8's texts (each checked
against a real RabbitMQ), matching and priorities, the policy + operator policy merge, and
vhost limits."""

from __future__ import annotations

import pytest

from broker.policy import (
    PolicyInvalid,
    PolicySet,
    effective_definition,
    limit_reached,
    parse_limits,
    parse_policy,
)


def policy(name: str = "p", pattern: str = "^q", operator: bool = False, **body):
    return parse_policy("/", name, {"pattern": pattern, **body}, operator=operator)


@pytest.mark.parametrize(("definition", "reason"), [
    ({"message-ttl": -1}, "-1 is not a valid message TTL"),
    ({"message-ttl": "a"}, '<<"a">> is not a valid message TTL'),
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"max-length": -1}, "-1 is not a valid maximum length"),
    ({"max-length-bytes": -1}, "-1 is not a valid maximum length in bytes"),
    ({"overflow": "foo"}, '<<"foo">> is not a valid overflow value'),
    ({"queue-mode": "foo"}, '<<"foo">> is not a valid queue-mode value'),
    ({"dead-letter-exchange": 5}, "5 is not a valid dead letter exchange name"),
    ({"alternate-exchange": 5}, "5 is not a valid alternate exchange name"),
    ({"foo": 1, "bar": 2}, '[{<<"bar">>,2},{<<"foo">>,1}] are not recognised policy settings'),
    ({}, "no policy provided"),
    ({"federation-upstream": 1}, "1 is not a valid federation upstream name"),
    ({"federation-upstream-set": ["a"]}, '[<<"a">>] is not a valid federation upstream set name'),
    ({"federation-upstream": "a", "federation-upstream-set": "all"},
     "cannot specify federation-upstream, federation-upstream-set or "
     "federation-upstream-pattern together"),
])
def test_invalid_definitions_get_rabbitmqs_reason(definition, reason):
    with pytest.raises(PolicyInvalid) as err:
        policy(definition=definition)
    assert err.value.reason == f"Validation failed\n\n{reason}\n"


@pytest.mark.parametrize(("body", "reason"), [
    ({"definition": {"max-length": 1}}, "[{key_missing,pattern}]"),
    ({"pattern": "^q"}, "[{key_missing,definition}]"),
    ({"pattern": 5, "definition": {"max-length": 1}},
     "Validation failed\n\npattern should be a binary but was 5\n"),
    ({"pattern": "^q", "definition": {"max-length": 1}, "apply-to": "bogus"},
     "Validation failed\n\napply-to 'bogus' unrecognised; should be 'queues', 'exchanges' "
     "or 'all'\n"),
    ({"pattern": "^q", "definition": {"max-length": 1}, "priority": "7"},
     'Validation failed\n\npriority should be a number, actually was <<"7">>\n'),
])
def test_invalid_bodies(body, reason):
    with pytest.raises(PolicyInvalid) as err:
        parse_policy("/", "p", body)
    assert err.value.reason == reason


def test_federation_keys_are_applied_keys():
    p = policy(definition={"federation-upstream-set": "all"}, **{"apply-to": "exchanges"})
    assert p.definition == {"federation-upstream-set": "all"} and p.inert_keys() == []


def test_bad_pattern_is_refused():
    with pytest.raises(PolicyInvalid) as err:
        policy(pattern="(", definition={"max-length": 1})
    assert "pattern should be regular expression but is invalid" in err.value.reason


def test_defaults_and_json_shape():
    p = policy(definition={"message-ttl": 5, "max-length": 1})
    assert p.json() == {"vhost": "/", "name": "p", "pattern": "^q", "apply-to": "all",
                        "definition": {"max-length": 1, "message-ttl": 5}, "priority": 0}
    assert list(p.definition) == ["max-length", "message-ttl"]  # sorted, as RabbitMQ lists
    assert policy(definition={"max-length": 1}, priority=1.5).priority == 1.5


def test_operator_policies_take_only_limits():
    assert policy(operator=True, definition={"max-length": 5, "expires": 10,
                                             "delivery-limit": 3}).operator
    for key, value in (("dead-letter-exchange", "x"), ("overflow", "reject-publish"),
                       ("queue-mode", "lazy"), ("alternate-exchange", "x")):
        with pytest.raises(PolicyInvalid, match="are not recognised policy settings"):
            policy(operator=True, definition={key: value})


def test_rabbitmq_keys_without_effect_are_accepted_and_named():
    p = policy(definition={"ha-mode": "all", "max-length": 1, "queue-version": 2})
    assert p.inert_keys() == ["ha-mode", "queue-version"]
    with pytest.raises(PolicyInvalid, match="3 is not a valid queue-version value"):
        policy(definition={"queue-version": 3})


def test_match_picks_highest_priority_and_respects_apply_to():
    s = PolicySet()
    s.put(policy("low", pattern="^orders", definition={"max-length": 1}))
    s.put(policy("high", pattern="^orders\\.", definition={"max-length": 2}, priority=5))
    s.put(policy("ex", pattern="^orders", definition={"alternate-exchange": "ae"},
                 priority=9, **{"apply-to": "exchanges"}))
    assert s.match("queues", "orders.new").name == "high"
    assert s.match("queues", "orders").name == "low"
    assert s.match("exchanges", "orders.in").name == "ex"
    assert s.match("queues", "billing") is None
    assert s.match("queues", "my.orders") is None  # anchored by its own ^
    s.put(policy("any", pattern="orders", definition={"max-length": 1}))
    assert s.match("queues", "my.orders").name == "any"  # searched, not anchored


def test_effective_definition_takes_the_stricter_operator_value():
    p = policy(definition={"max-length": 10, "message-ttl": 5000, "overflow": "drop-head"})
    op = policy("op", operator=True, definition={"max-length": 50, "message-ttl": 2000,
                                                 "expires": 100000})
    assert effective_definition(p, op) == {"expires": 100000, "max-length": 10,
                                           "message-ttl": 2000, "overflow": "drop-head"}
    assert effective_definition(None, op) == dict(op.definition)
    assert effective_definition(p, None) == dict(p.definition)
    assert effective_definition(None, None) == {}


def test_limits():
    assert parse_limits({"max-queues": 3, "max-connections": -1}) == {
        "max-queues": 3, "max-connections": -1}
    with pytest.raises(PolicyInvalid) as err:
        parse_limits({"bogus": 3})
    assert err.value.reason == ('Validation failed\n\nUnrecognised terms [{<<"bogus">>,3}] '
                                "in limits\n")
    with pytest.raises(PolicyInvalid, match=r"max-queues should be a number, actually was 1\.5"):
        parse_limits({"max-queues": 1.5})
    assert limit_reached({"max-queues": 2}, "max-queues", 1) is None
    assert limit_reached({"max-queues": 2}, "max-queues", 2) == 2
    assert limit_reached({"max-queues": 0}, "max-queues", 0) == 0
    assert limit_reached({"max-queues": -1}, "max-queues", 10**6) is None
    assert limit_reached({}, "max-queues", 10**6) is None
