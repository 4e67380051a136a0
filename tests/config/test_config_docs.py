"""hare.example.toml and docs/CONFIGURATION.md stay in step with the Settings model."""

from __future__ import annotations

import re
from pathlib import Path

from broker.config import Settings, check_password, env_name, flag_name, load_settings
from broker.config.settings import key_info

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "hare.example.toml"
DOC = ROOT / "docs" / "CONFIGURATION.md"


def test_example_loads_to_the_defaults() -> None:
    assert load_settings(["--config", str(EXAMPLE)], {}) == Settings()


def test_example_names_every_key() -> None:
    text = EXAMPLE.read_text()
    for name in key_info():
        plain = re.search(rf"^(# )?{name} = ", text, re.MULTILINE)
        table = f"# [[{name}]]" in text
        assert plain or table, f"{name} missing from hare.example.toml"


def test_example_commented_tables_are_valid(tmp_path: Path) -> None:
    head, tables = EXAMPLE.read_text().split("# --- users and permissions", 1)
    uncommented = "\n".join(
        line.removeprefix("#").removeprefix(" ") for line in tables.splitlines()[1:]
    )
    config = tmp_path / "hare.toml"
    config.write_text(head + uncommented)
    settings = load_settings(["--config", str(config)], {})
    assert [user.name for user in settings.users] == ["admin", "app"]
    assert check_password("change-me", settings.users[0].password_hash)
    assert check_password("test12", settings.users[1].password_hash)
    assert settings.permissions[0].configure == r"^app\."
    assert [shovel.name for shovel in settings.shovels] == ["orders-in"]


def test_doc_gives_every_key_env_and_flag() -> None:
    text = DOC.read_text()
    for name, f in key_info().items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"{name} has no row in CONFIGURATION.md"
        if not f.metadata["file_only"]:
            assert f"`{env_name(name)}`" in row and f"`{flag_name(name)}`" in row, name
