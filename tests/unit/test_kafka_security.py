"""The Kafka security keys (capturer/util/kafkasec.py): what each library is given, what config
time refuses (naming file, line, section and key), and the errors explained naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from capturer import config
from capturer.apply.config import load_apply_config
from capturer.errors import ConfigError
from capturer.util.kafkasec import explain, kafka_python_conf, librdkafka_conf, masked
from senders import CATALOG


def sasl_ssl(ca: str, **kw: object) -> dict[str, object]:
    o: dict[str, object] = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                            "sasl_username": "u", "sasl_password": "s3cr3t", "ssl_ca": ca, "ssl_cert": "",
                            "ssl_key": "", "ssl_check_hostname": True}
    o.update(kw)
    return o


def test_each_library_gets_its_own_names(tmp_path: Path) -> None:
    o = sasl_ssl("/ca.pem", ssl_cert="/c.pem", ssl_key="/k.pem")
    assert kafka_python_conf(o) == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u",
        "sasl_plain_password": "s3cr3t", "ssl_check_hostname": True, "ssl_cafile": "/ca.pem",
        "ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem"}
    assert librdkafka_conf(o) == {
        "security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "u",
        "sasl.password": "s3cr3t", "ssl.endpoint.identification.algorithm": "https", "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem"}
    off = sasl_ssl("", ssl_check_hostname=False)
    assert librdkafka_conf(off)["ssl.endpoint.identification.algorithm"] == "none"
    assert "ssl.ca.location" not in librdkafka_conf(off)  # the system's roots
    assert kafka_python_conf({}) == {"security_protocol": "PLAINTEXT"}
    assert librdkafka_conf({}) == {"security.protocol": "plaintext"}
    assert masked(o)["sasl_password"] == "***"


def write(tmp: Path, kafka: str) -> Path:
    p = tmp / "senderConfig.cfg"
    p.write_text(f"[global]\ntype=kafka\n[kafka]\nservers=127.0.0.1:9092\n{kafka}")
    return p


def test_config_time_checks_name_file_section_and_key(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    ok = write(tmp_path, f"security_protocol=sasl_ssl\nsasl_mechanism=scram-sha-512\nsasl_username=u\n"
                         f"sasl_password=s3cr3t\nssl_ca={ca}\n")
    (sc,) = config.load_sender_config(ok, CATALOG)
    assert sc.options["security_protocol"] == "SASL_SSL" and sc.options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert "sasl_password" in sc.secret
    bad = {
        f"security_protocol=SASL_SSL\nsasl_password=s3cr3t\nssl_ca={ca}\n": "sasl_username",
        "security_protocol=SASL_SSL\nsasl_username=u\n": "sasl_password",
        f"security_protocol=SSL\nssl_ca={tmp_path / 'nope.pem'}\n": "ssl_ca",
        f"security_protocol=SSL\nssl_cert={ca}\n": "ssl_cert",
        f"ssl_ca={ca}\n": "ssl_ca",  # PLAINTEXT does not use TLS
        "sasl_username=u\nsasl_password=s3cr3t\n": "sasl_username",  # nor SASL
        "security_protocol=SASL_SSL\nsasl_mechanism=GSSAPI\n": "sasl_mechanism",
    }
    for text, key in bad.items():
        with pytest.raises(ConfigError) as e:
            config.load_sender_config(write(tmp_path, text), CATALOG)
        msg = str(e.value)
        assert f"{tmp_path / 'senderConfig.cfg'}:" in msg and f"[kafka] {key}" in msg, (text, msg)
        assert "s3cr3t" not in msg


def test_applier_keys(tmp_path: Path) -> None:
    sc = tmp_path / "s.cfg"
    sc.write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'x.jsonl'}\n")
    p = tmp_path / "apply.cfg"
    p.write_text(f"[global]\nservers=b:9093\ntxn_topic=t\nsenderConfig={sc}\nsecurity_protocol=SASL_SSL\n"
                 "sasl_mechanism=PLAIN\nsasl_username=key\nsasl_password=topsecret\n")
    cfg = load_apply_config(p, CATALOG, base_dir=tmp_path)
    assert cfg.security["sasl_username"] == "key" and "topsecret" not in str(cfg.masked())
    p.write_text(p.read_text() + f"ssl_key={tmp_path / 'x.jsonl'}\n")
    with pytest.raises(ConfigError, match=r"\[global\] ssl_key: ssl_cert and ssl_key go together"):
        load_apply_config(p, CATALOG, base_dir=tmp_path)


def test_errors_explained_naming_the_setting() -> None:
    o = sasl_ssl("/etc/ca.pem")
    why = explain("SaslAuthenticationFailedError: Authentication failed during authentication due to invalid "
                  "credentials with SASL mechanism SCRAM-SHA-512", "sender kafka", o, "[kafka] of s.cfg")
    assert why is not None and "sasl_password in [kafka] of s.cfg" in why and "s3cr3t" not in why
    why = explain("SSL handshake failed: error:0A000086:SSL routines::certificate verify failed", "applier a", o)
    assert why is not None and "ssl_ca = /etc/ca.pem" in why
    assert explain("Broker transport failure", "x", o) is None
