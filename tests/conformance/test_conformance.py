"""The conformance table: every row of cases.py, run against Hare, must answer as RabbitMQ
3.10.8 did when the table was recorded (rabbitmq-3.10.8.json, made by record.py), except the
rows that say why Hare differs on purpose (`differs`, listed in docs/CONFORMANCE.md) and the
rows someone is fixing (`xfail`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.cases import ROWS
from tests.conformance.record import load
from tests.conformance.wire import Admin, Row, differences, run

RECORDED = load()
DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFORMANCE.md"


class _Admins:
    """One admin connection for the module, replaced when a row leaves it in a bad state."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.admin: Admin | None = None

    def get(self) -> Admin:
        if self.admin is None:
            self.admin = Admin("127.0.0.1", self.port)
        return self.admin

    def drop(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None


@pytest.fixture(scope="module")
def admins(broker) -> Iterator[_Admins]:
    holder = _Admins(broker.port)
    yield holder
    holder.drop()


def _rows() -> Iterator[object]:
    for row in ROWS:
        marks = [pytest.mark.xfail(reason=row.xfail, strict=True)] if row.xfail else []
        yield pytest.param(row, id=row.name, marks=marks)


@pytest.mark.parametrize("row", list(_rows()))
def test_row(broker, admins: _Admins, row: Row) -> None:
    expected = row.hare if row.differs else RECORDED[row.name]
    assert expected is not None, f"{row.name}: a chosen difference needs Hare's answer"
    try:
        # a row expected to fail is not waited for long: its answer will not come
        got = run(row, "127.0.0.1", broker.port, admins.get(), expect=expected,
                  timeout=1.0 if row.xfail else 5.0)
    except Exception:
        admins.drop()
        raise
    assert differences(expected, got) == []


def test_every_row_is_recorded() -> None:
    names = [r.name for r in ROWS]
    assert len(names) == len(set(names))
    assert set(names) == set(RECORDED), "re-record: python -m tests.conformance.record --only ..."


def test_chosen_differences_are_listed_in_the_docs() -> None:
    text = DOC.read_text()
    listed = set(re.findall(r"`([a-z0-9./\-]+/[a-z0-9.\-]+)`", text))
    chosen = {r.name for r in ROWS if r.differs}
    assert chosen <= listed, f"docs/CONFORMANCE.md lacks {sorted(chosen - listed)}"
    for r in ROWS:
        if r.differs:
            assert r.hare is not None and r.differs and "\n" not in r.differs
