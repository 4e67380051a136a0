"""A plugin's records file (broker/store/plugin_records.py), on a real directory."""

from __future__ import annotations

from pathlib import Path

from broker.store.plugin_records import load_records, save_records


def test_no_file_yet_is_no_records(tmp_path: Path) -> None:
    assert load_records(tmp_path / "shovels.json") == []


def test_records_saved_whole_come_back_and_leave_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "federation.json"
    save_records(path, [{"vhost": "/", "name": "a", "value": {"uri": "amqp://"}, "user": "u"}])
    save_records(path, [{"vhost": "/", "name": "b", "value": [], "user": None}])
    assert load_records(path) == [{"vhost": "/", "name": "b", "value": [], "user": None}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["federation.json"]


def test_a_file_that_is_not_a_list_is_no_records(tmp_path: Path) -> None:
    path = tmp_path / "shovels.json"
    path.write_text('{"not": "a list"}')
    assert load_records(path) == []
