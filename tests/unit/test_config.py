from __future__ import annotations

from pathlib import Path

import pytest

from capturer.app import load_config
from capturer.errors import ConfigError

GOOD_SENDERS = "[global]\ntype=local\n[local]\nfilepath=./x.jsonl\n"


def write(tmp: Path, cfg: str, senders: str = GOOD_SENDERS) -> Path:
    (tmp / "senderConfig.cfg").write_text(senders)
    (tmp / "filter_rule.txt").write_text("")
    p = tmp / "config.cfg"
    p.write_text(cfg)
    return p


BASE = """[global]
binlogCheckPointPath=./cp.json
senderConfig=./senderConfig.cfg
filterRuleDict=./filter_rule.txt
httpPort=8080
[region:a]
host=127.0.0.1
port=3306
user=u
password=p%secret
server_id=10
"""


def test_good_config(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), base_dir=tmp_path)
    assert cfg.regions[0].password == "p%secret"  # no interpolation
    assert cfg.checkpoint_path == tmp_path / "cp.json"
    assert cfg.http_host == "127.0.0.1"
    assert "p%secret" not in str(cfg.masked()) and "p%secret" not in repr(cfg)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda s: s.replace("port=3306", "port=abc"), ":8: [region:a] port: bad value 'abc'"),
        (lambda s: s.replace("port=3306", "port=70000"), "[region:a] port"),
        (lambda s: s.replace("server_id=10\n", ""), "missing required key 'server_id'"),
        (lambda s: s + "colour=blue\n", "unknown key 'colour'"),
        (lambda s: s + "[mystery]\n", "unknown section [mystery]"),
        (lambda s: s.replace("httpPort=8080", "httpPort=8080\nhttpPort=9"), "httpPort is set twice"),
        (lambda s: s.replace("[region:a]", "[region:a b]"), "region name"),
        (lambda s: s.replace("host=127.0.0.1\n", "host 127.0.0.1\n"), "expected 'key = value'"),
        (lambda s: s.split("[region:a]")[0], "no [region:NAME] section"),
        (lambda s: s + "start=yesterday\n", "[region:a] start"),
        # a server is the host or one of the replicas of one region only (issue 49)
        (lambda s: s + "replicas=db2:3306\n[region:b]\nhost=DB2\nuser=u\nserver_id=11\n",
         "regions [region:a] and [region:b] read the same server db2:3306 ([region:b] host"),
        (lambda s: s + "[region:b]\nhost=db3\nreplicas=db4:3307, 127.0.0.1:3306\nuser=u\nserver_id=11\n",
         "regions [region:a] and [region:b] read the same server 127.0.0.1:3306 ([region:b] replicas"),
    ],
)
def test_bad_config_names_file_section_key(tmp_path: Path, edit, needle: str) -> None:  # type: ignore[no-untyped-def]
    p = write(tmp_path, edit(BASE))
    with pytest.raises(ConfigError) as ei:
        load_config(p, base_dir=tmp_path)
    assert str(p) in str(ei.value) and needle in str(ei.value)


def test_password_not_echoed_on_error(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.replace("server_id=10", "server_id=x"))
    with pytest.raises(ConfigError) as ei:
        load_config(p, base_dir=tmp_path)
    assert "p%secret" not in str(ei.value)


@pytest.mark.parametrize(
    "senders,needle",
    [
        ("[global]\ntype=local,carrier_pigeon\n", "unknown sender 'carrier_pigeon'; known: kafka, local, mysql, spark"),
        ("[global]\ntype=local\n[local]\nfilepath=x\nformat=xml\n", "[local] format: bad value 'xml'"),
        ("[global]\ntype=local\n[local]\nfilpath=x\n", "unknown key 'filpath'"),
        ("[local]\nfilepath=x\n", "missing section [global]"),
    ],
)
def test_bad_sender_config(tmp_path: Path, senders: str, needle: str) -> None:
    p = write(tmp_path, BASE, senders)
    with pytest.raises(ConfigError) as ei:
        load_config(p, base_dir=tmp_path)
    assert "senderConfig.cfg" in str(ei.value) and needle in str(ei.value)


def test_senders_are_validated_by_the_composition_root_only(tmp_path: Path) -> None:
    """capturer.config never imports a sender: the capturer's loader (capturer.app)
    passes the registry; without it the sender file is not read, and a Capturer
    refuses such a config rather than starting with no sender."""
    from capturer import config
    from capturer.app import Capturer

    bad_senders = "[global]\ntype=local\n[local]\nfilepath=./x.jsonl\nbogus=1\n"
    p = write(tmp_path, BASE, senders=bad_senders)
    with pytest.raises(ConfigError, match=r"senderConfig.cfg:5.*bogus"):
        load_config(p, base_dir=tmp_path)
    bare = config.load_config(p, base_dir=tmp_path)  # the CLI and the agent read only global + regions
    assert bare.senders == () and bare.regions[0].name == "a"
    with pytest.raises(ConfigError, match="no sender loaded"):
        Capturer(bare)


def test_secret_sender_options_are_masked(tmp_path: Path) -> None:
    mysql = ("[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport=3306\nuser=u\npassword=s3cr%t\n")
    cfg = load_config(write(tmp_path, BASE, senders=mysql), base_dir=tmp_path)
    masked = cfg.masked()["senders"]["mysql"]
    assert masked["password"] == "***" and masked["user"] == "u"
    assert "s3cr%t" not in str(cfg.masked())


def test_a_token_in_a_sender_url_is_masked(tmp_path: Path) -> None:
    """The effective config (logged at start, served on the status server) shows a webhook's
    URLs without their password and query values (a token there)."""
    hook = ("[global]\ntype=webhook\n[webhook]\nurl=https://u:pw7Sekret@h/in?token=q7Sekret&x=1\n"
            "position_url=https://h/pos?key=q7Sekret\n")
    cfg = load_config(write(tmp_path, BASE, senders=hook), base_dir=tmp_path)
    masked = cfg.masked()["senders"]["webhook"]
    assert masked["url"] == "https://u:***@h/in?token=***&x=***" and masked["position_url"] == "https://h/pos?key=***"
    assert "7Sekret" not in str(cfg.masked())
