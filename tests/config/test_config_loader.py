"""Loading order, error lines and the flag parser of broker.config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import (
    CONFIG_ENV,
    CertLoginFrom,
    ConfigError,
    Fsync,
    LogFormat,
    MemoryWatermark,
    PermissionSpec,
    Settings,
    SslVerify,
    TlsVersion,
    Unroutable,
    build_arg_parser,
    check_password,
    env_name,
    flag_name,
    hash_password,
    load_settings,
)
from broker.config.settings import key_info


def write(tmp_path: Path, text: str, name: str = "hare.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(argv: list[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env or {})
    message = str(info.value)
    assert "\n" not in message, "a config error is one line"
    return message


def test_defaults_without_any_source() -> None:
    settings = load_settings([], {})
    assert settings == Settings()
    assert settings.port == 5672 and settings.host == ""
    assert settings.fsync is Fsync.BATCH and settings.unroutable is Unroutable.ACK
    assert settings.vm_memory_high_watermark == MemoryWatermark(relative=0.4)
    assert settings.msg_store_file_size_limit == 16 * 1024 * 1024
    assert settings.disk_free_limit == 50_000_000


@pytest.mark.parametrize(
    ("in_env", "in_flag", "expected"),
    [(False, False, 1000), (True, False, 2000), (True, True, 3000), (False, True, 3000)],
)
def test_file_then_env_then_flags(
    tmp_path: Path, in_env: bool, in_flag: bool, expected: int
) -> None:
    config = write(tmp_path, "port = 1000\nheartbeat_s = 5\n")
    argv = ["--config", str(config)] + (["--port", "3000"] if in_flag else [])
    env = {"HARE_PORT": "2000"} if in_env else {}
    settings = load_settings(argv, env)
    assert settings.port == expected
    assert settings.heartbeat_s == 5  # untouched keys keep the file's value


def test_config_path_from_env_and_flag_wins(tmp_path: Path) -> None:
    from_env = write(tmp_path, "port = 1111\n", "env.toml")
    from_flag = write(tmp_path, "port = 2222\n", "flag.toml")
    assert load_settings([], {CONFIG_ENV: str(from_env)}).port == 1111
    assert load_settings(["--config", str(from_flag)], {CONFIG_ENV: str(from_env)}).port == 2222


def test_every_key_from_text_sources() -> None:
    env = {
        "HARE_VM_MEMORY_HIGH_WATERMARK": "256MiB",
        "HARE_LOOPBACK_USERS": "",
        "HARE_VHOSTS": "a, b",
        "HARE_DATA_DIR": "~/hare-data",
        "HARE_FSYNC": "ALWAYS",
        "HARE_LOG_LEVEL": "warn",
        "HARE_DISK_FREE_LIMIT": "1GB",
        "HARE_HANDSHAKE_TIMEOUT_S": "2.5",
    }
    argv = ["--log-format", "json", "--unroutable", "nack", "--management-port=0"]
    settings = load_settings(argv, env)
    assert settings.vm_memory_high_watermark.absolute_bytes == 256 * 1024 * 1024
    assert settings.loopback_users == ()
    assert settings.vhosts == ("a", "b")
    assert settings.data_dir == Path.home() / "hare-data"
    assert settings.fsync is Fsync.ALWAYS
    assert settings.log_level == "warning"
    assert settings.disk_free_limit == 10**9
    assert settings.handshake_timeout_s == 2.5
    assert settings.log_format is LogFormat.JSON
    assert settings.unroutable is Unroutable.NACK
    assert settings.management_port == 0


def test_typed_values_from_file(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        """
host = "::1"
vm_memory_high_watermark = 0.6
msg_store_file_size_limit = "1MiB"
queue_index_embed_msgs_below = 0
loopback_users = []
vhosts = ["prod"]
""",
    )
    settings = load_settings(["--config", str(config)], {})
    assert settings.host == "::1"
    assert settings.vm_memory_high_watermark == MemoryWatermark(relative=0.6)
    assert settings.vm_memory_high_watermark.limit_bytes(1000) == 600
    assert settings.msg_store_file_size_limit == 1024 * 1024
    assert settings.queue_index_embed_msgs_below == 0
    assert settings.vhosts == ("prod",)


def test_every_key_has_flag_and_env_except_tables() -> None:
    parser = build_arg_parser()
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for required in (
        "--host",
        "--port",
        "--data-dir",
        "--config",
        "--log-level",
        "--log-format",
        "--management-port",
        "--vm-memory-high-watermark",
        "--fsync",
    ):
        assert required in flags
    for name, f in key_info().items():
        assert (flag_name(name) in flags) is not f.metadata["file_only"], name
        assert env_name(name) == "HARE_" + name.upper()
    assert {n for n, f in key_info().items() if f.metadata["file_only"]} == {
        "users", "permissions", "shovels"}


def test_help_lists_flags_with_env_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_settings(["--help"], {})
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--port PORT" in out and "HARE_PORT" in out and "default 5672" in out
    assert "guest" not in out.split("--default-pass", 1)[1].split("--loopback-users")[0]


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "must_name"),
    [
        ('port = "5672"\n', ["port", "expected an integer"]),
        ("port = 70000\n", ["port", "between 0 and 65535"]),
        ("prot = 1\n", ["unknown key 'prot'", "did you mean port"]),
        ('[store]\nfsync = "always"\n', ["unknown key 'store'", "flat"]),
        ('fsync = "sometimes"\n', ["fsync", "'always', 'batch', 'never'"]),
        ("frame_max = 100\n", ["frame_max", "between 4096"]),
        ("heartbeat_s = true\n", ["heartbeat_s", "expected an integer"]),
        ("vm_memory_high_watermark = 1.5\n", ["vm_memory_high_watermark", "fraction"]),
        ('disk_free_limit = "50 parsecs"\n', ["disk_free_limit", "50 parsecs"]),
        ("msg_store_gc_garbage_fraction = 0\n", ["msg_store_gc_garbage_fraction"]),
        ('loopback_users = "guest"\n', ["loopback_users", "list of strings"]),
        ('vhosts = ["a", "a"]\n', ["vhosts", "duplicate"]),
        ("port = \n", ["invalid TOML"]),
        (
            "credit_flow_initial_credit = 10\n",
            ["credit_flow_more_credit_after (default)", "credit_flow_initial_credit (config file"],
        ),
    ],
)
def test_bad_file_value_names_key_and_file(tmp_path: Path, text: str, must_name: list[str]) -> None:
    config = write(tmp_path, text)
    message = error_of(["--config", str(config)])
    assert str(config) in message
    for part in must_name:
        assert part in message


@pytest.mark.parametrize(
    ("env", "must_name"),
    [
        ({"HARE_PORT": "five"}, ["environment variable HARE_PORT", "'five'"]),
        ({"HARE_PROT": "1"}, ["HARE_PROT", "did you mean HARE_PORT"]),
        ({"HARE_USERS": "bob"}, ["HARE_USERS", "config file"]),
        ({"HARE_HEARTBEAT_S": "-1"}, ["HARE_HEARTBEAT_S", "between 0"]),
        ({"HARE_LOG_LEVEL": "loud"}, ["HARE_LOG_LEVEL", "'loud'"]),
        ({"HARE_MEMORY_MONITOR_INTERVAL_S": "nan"}, ["HARE_MEMORY_MONITOR_INTERVAL_S"]),
        ({"HARE_DEFAULT_USER": ""}, ["HARE_DEFAULT_USER", "empty"]),
    ],
)
def test_bad_env_value_names_variable(env: dict[str, str], must_name: list[str]) -> None:
    message = error_of([], env)
    for part in must_name:
        assert part in message


@pytest.mark.parametrize(
    ("argv", "must_name"),
    [
        (["--port", "x"], ["flag --port", "'x'"]),
        (["--prot", "1"], ["flag --prot", "did you mean --port"]),
        (["--po", "1"], ["flag --po"]),  # no abbreviations
        (["--port"], ["--port", "expected one argument"]),
        (["serve"], ["unexpected argument 'serve'"]),
        (["--config", "/nonexistent/hare.toml"], ["/nonexistent/hare.toml", "not found"]),
        (["--credit-flow-more-credit-after", "500"], ["flag --credit-flow-more-credit-after"]),
    ],
)
def test_bad_flag_names_flag(argv: list[str], must_name: list[str]) -> None:
    message = error_of(argv)
    for part in must_name:
        assert part in message


def test_unrelated_environment_is_ignored() -> None:
    env = {
        "PATH": "/bin",
        "HAREBELL": "x",
        "RABBITMQ_PORT": "1",
        "HARE_MANAGEMENT_URL": "http://localhost:15672",  # hare-ctl's
        "HARE_PERF_TEST_URL": "amqp://",
        "HARE_CTL_ANYTHING": "x",
        "HARE_TEST_ANYTHING": "x",
        "HARE_COMPOSE_AMQP_PORT": "5673",  # docker/compose.yaml's
    }
    assert load_settings([], env) == Settings()


USERS = """
[[users]]
name = "admin"
password = "s3cret-pass"
tags = ["administrator"]

[[users]]
name = "app"
password_hash = "{app_hash}"

[[permissions]]
user = "app"
vhost = "prod"
configure = "^app\\\\."
write = ".*"
read = ".*"
"""


def test_users_and_permissions(tmp_path: Path) -> None:
    app_hash = hash_password("app-pass")
    top = 'vhosts = ["prod"]\ndefault_pass = "default-secret"\n'
    config = write(tmp_path, top + USERS.format(app_hash=app_hash))
    settings = load_settings(["--config", str(config)], {})
    admin, app = settings.users
    assert admin.name == "admin" and admin.tags == ("administrator",)
    assert admin.password_hash != "s3cret-pass"
    assert check_password("s3cret-pass", admin.password_hash)
    assert app.password_hash == app_hash and app.tags == ()
    assert settings.permissions == (PermissionSpec("app", "prod", r"^app\.", ".*", ".*"),)
    # No secret in the repr or the start-up summary.
    for shown in (repr(settings), str(settings.redacted())):
        assert "s3cret-pass" not in shown and admin.password_hash not in shown
        assert "default-secret" not in shown


@pytest.mark.parametrize(
    ("table", "must_name"),
    [
        ('name = "u"\n', "exactly one of 'password' or 'password_hash'"),
        ('name = "u"\npassword = "p1-secret"\npassword_hash = "x"\n', "exactly one"),
        ('name = "u"\npassword_hash = "bm90IGEgaGFzaA=="\n', "rabbit_password_hashing_sha256"),
        ('name = "u"\npasswd = "p1-secret"\n', "unknown key 'passwd'"),
        ('password = "p1-secret"\n', "missing key 'name'"),
        ('name = "u"\npassword = "p1-secret"\ntags = "admin"\n', "tags"),
        ('name = "u"\npassword = 12345\n', "password: expected a string"),
    ],
)
def test_bad_user_table(tmp_path: Path, table: str, must_name: str) -> None:
    config = write(tmp_path, "[[users]]\n" + table)
    message = error_of(["--config", str(config)])
    assert f"config file {config}: users: entry 1" in message
    assert must_name in message
    assert "p1-secret" not in message and "12345" not in message


def test_top_level_key_after_table_gets_a_hint(tmp_path: Path) -> None:
    config = write(tmp_path, '[[users]]\nname = "u"\npassword = "p"\nport = 1\n')
    assert "top-level keys must come before" in error_of(["--config", str(config)])


@pytest.mark.parametrize(
    ("permission", "must_name"),
    [
        (
            'user = "ghost"\nvhost = "/"\nconfigure = ""\nwrite = ""\nread = ""\n',
            "user 'ghost' is not declared",
        ),
        (
            'user = "guest"\nvhost = "nope"\nconfigure = ""\nwrite = ""\nread = ""\n',
            "vhost 'nope' is not declared",
        ),
        (
            'user = "guest"\nvhost = "/"\nconfigure = "("\nwrite = ""\nread = ""\n',
            "configure: not a regular expression",
        ),
        ('user = "guest"\nvhost = "/"\n', "missing key 'configure'"),
    ],
)
def test_bad_permission(tmp_path: Path, permission: str, must_name: str) -> None:
    config = write(tmp_path, "[[permissions]]\n" + permission)
    message = error_of(["--config", str(config)])
    assert str(config) in message and must_name in message


def run_check(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.config", *args],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_check_command_prints_effective_settings(tmp_path: Path) -> None:
    config = write(tmp_path, 'default_pass = "do-not-print"\nport = 1234\n')
    done = run_check(["--config", str(config), "--fsync", "never"], {})
    assert done.returncode == 0, done.stderr
    assert '"port": 1234' in done.stdout and '"fsync": "never"' in done.stdout
    assert "do-not-print" not in done.stdout


def test_check_command_bad_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_check([], {"HARE_PORT": "eighty"})
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "HARE_PORT" in done.stderr and "'eighty'" in done.stderr


def test_tls_keys_from_file_env_and_flags(tmp_path: Path) -> None:
    config = write(tmp_path, """
ssl_certfile = "/etc/hare/server.pem"
ssl_cacertfile = "/etc/hare/ca.pem"
ssl_verify = "verify_peer"
ssl_fail_if_no_peer_cert = true
auth_mechanisms = ["PLAIN", "external"]
""")
    env = {"HARE_SSL_MIN_VERSION": "TLSv1.3", "HARE_SSL_KEYFILE": "/etc/hare/key.pem"}
    argv = ["--config", str(config), "--ssl-cert-login-from", "distinguished_name",
            "--management-ssl-certfile", "/etc/hare/web.pem",
            "--management-ssl-fail-if-no-peer-cert", "no"]
    s = load_settings(argv, env)
    assert s.ssl_certfile == Path("/etc/hare/server.pem")
    assert s.ssl_keyfile == Path("/etc/hare/key.pem")
    assert s.ssl_verify is SslVerify.VERIFY_PEER and s.ssl_fail_if_no_peer_cert is True
    assert s.ssl_min_version is TlsVersion.TLS1_3
    assert s.auth_mechanisms == ("PLAIN", "EXTERNAL")
    assert s.ssl_cert_login_from is CertLoginFrom.DISTINGUISHED_NAME
    assert s.management_ssl_certfile == Path("/etc/hare/web.pem")
    assert s.management_ssl_fail_if_no_peer_cert is False
    # an empty variable or flag unsets a file given in the file: the listener goes off again
    web = write(tmp_path, 'management_ssl_certfile = "/etc/hare/web.pem"', "web.toml")
    unset = load_settings(["--config", str(web)], {"HARE_MANAGEMENT_SSL_CERTFILE": ""})
    assert unset.management_ssl_certfile is None


@pytest.mark.parametrize(("argv", "must_name"), [
    (["--ssl-keyfile", "/k.pem"], ["ssl_keyfile", "ssl_certfile"]),
    (["--management-ssl-cacertfile", "/ca.pem"],
     ["management_ssl_cacertfile", "management_ssl_certfile"]),
    (["--ssl-certfile", "/c.pem", "--ssl-verify", "verify_peer"],
     ["ssl_verify", "ssl_cacertfile"]),
    (["--ssl-certfile", "/c.pem", "--ssl-fail-if-no-peer-cert", "true"],
     ["ssl_fail_if_no_peer_cert", "verify_peer"]),
    (["--ssl-fail-if-no-peer-cert", "maybe"], ["--ssl-fail-if-no-peer-cert", "true or false"]),
    (["--ssl-min-version", "tlsv1.1"], ["--ssl-min-version", "tlsv1.2"]),
    (["--auth-mechanisms", "PLAIN,CRAM-MD5"], ["--auth-mechanisms", "CRAM-MD5"]),
    (["--auth-mechanisms", ""], ["--auth-mechanisms", "at least one"]),
    (["--auth-mechanisms", "PLAIN,EXTERNAL"], ["auth_mechanisms", "ssl_certfile", "verify_peer"]),
    (["--auth-mechanisms", "EXTERNAL", "--ssl-certfile", "/c.pem"],
     ["auth_mechanisms", "verify_peer"]),
])
def test_tls_keys_that_do_not_fit_together(argv: list[str], must_name: list[str]) -> None:
    message = error_of(argv)
    for word in must_name:
        assert word in message, (word, message)


def test_shovels_tables_keep_their_keys_and_hide_uri_passwords(tmp_path: Path) -> None:
    config = write(tmp_path, '[[shovels]]\nname = "in"\nsrc-uri = "amqp://u:p4ss-word@h/x"\n'
                             'src-queue = "a"\ndest-uri = ["amqp://"]\n')
    (shovel,) = load_settings(["--config", str(config)], {}).shovels
    assert shovel.name == "in"
    assert shovel.value == {"src-uri": "amqp://u:p4ss-word@h/x", "src-queue": "a",
                            "dest-uri": ["amqp://"]}
    shown = str(load_settings(["--config", str(config)], {}).redacted())
    assert "p4ss-word" not in shown and "amqp://u:***@h/x" in shown


@pytest.mark.parametrize(
    ("tables", "must_name"),
    [
        ('[[shovels]]\nsrc-queue = "a"\n', "entry 1: missing key 'name'"),
        ('[[shovels]]\nname = "a"\n[[shovels]]\nname = "a"\n',
         "entry 2: shovel 'a' declared twice"),
        ('shovels = "x"\n', "expected an array of tables"),
    ],
)
def test_bad_shovel_table(tmp_path: Path, tables: str, must_name: str) -> None:
    config = write(tmp_path, tables)
    message = error_of(["--config", str(config)])
    assert f"config file {config}: shovels: " in message and must_name in message
