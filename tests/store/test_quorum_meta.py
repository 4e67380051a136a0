"""The quorum member file (broker/store/quorum_meta.py): states and delivery counts replay in
order, a torn tail is cut, damage in the middle makes the member a non-voter, compaction keeps
the same state."""

from __future__ import annotations

from pathlib import Path

from broker.store.quorum_meta import (
    MemberState,
    MetaFile,
    encode_counts,
    encode_state,
    scan_meta,
)


def _file(tmp_path: Path, *records: bytes) -> MetaFile:
    meta = MetaFile(tmp_path)
    for r in records:
        meta.append(r)
    meta.close()
    return meta


def test_last_state_wins_and_counts_replay(tmp_path: Path) -> None:
    s1 = MemberState(1, 1, 5, True, [(1, 0)])
    s2 = MemberState(3, 2, 9, True, [(1, 0), (2, 40)])
    _file(tmp_path, encode_counts([(4, 2), (7, 1)]), encode_state(s1),
          encode_counts([(4, 0), (7, 3)]), encode_state(s2))
    scan = MetaFile(tmp_path).load()
    assert scan.state == s2 and scan.counts == {7: 3} and not scan.damaged


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    s1 = MemberState(1, 1, 5, True, [(1, 0)])
    meta = _file(tmp_path, encode_state(s1))
    whole = meta.path.read_bytes()
    meta.path.write_bytes(whole + encode_state(MemberState(1, 1, 6, True))[:-3])
    scan = MetaFile(tmp_path).load()
    assert scan.state == s1 and not scan.damaged and scan.torn_bytes
    assert meta.path.read_bytes() == whole  # cut back to the last good record


def test_damage_in_the_middle_is_not_a_torn_tail(tmp_path: Path) -> None:
    meta = _file(tmp_path, encode_state(MemberState(1, 1, 5, True)),
                 encode_state(MemberState(1, 1, 6, True)), encode_state(MemberState(1, 1, 7, True)))
    raw = bytearray(meta.path.read_bytes())
    raw[8 + 12] ^= 0xFF  # inside the first STATE record's body
    meta.path.write_bytes(bytes(raw))
    scan = scan_meta(bytes(raw))
    assert scan.damaged
    assert MetaFile(tmp_path).load().damaged
    assert meta.path.read_bytes() == bytes(raw)  # kept as it is for a look


def test_not_ours_scans_as_damaged(tmp_path: Path) -> None:
    assert scan_meta(b"garbage here").damaged
    assert scan_meta(b"").state is None and not scan_meta(b"").damaged


def test_rewrite_keeps_the_state(tmp_path: Path) -> None:
    meta = MetaFile(tmp_path)
    for pos in range(1, 200):
        meta.append(encode_counts([(pos, 2)]) + encode_state(MemberState(2, 2, pos, True)))
    state = MemberState(2, 2, 199, True, [(1, 0), (2, 100)])
    before = meta.size
    meta.rewrite(state, {5: 2, 9: 4})
    assert meta.size < before
    meta.append(encode_counts([(9, 0)]))
    scan = MetaFile(tmp_path).load()
    assert scan.state == state and scan.counts == {5: 2}
