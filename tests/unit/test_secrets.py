"""Secrets never reach logs, metrics, status, audit rows or error messages."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from lakemirror.daemon.settings import load_settings
from lakemirror.secrets import MASK, is_secret_key, mask_secrets, redact
from lakemirror.supervisor.control.classify_errors import classify

TOKEN = "s3cr3t-T0ken-value-9f8e7d"


@pytest.mark.parametrize("key", [
    "auth_token", "password", "DB_PASSWORD", "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key",
    "fs.azure.account.key.acct.dfs.core.windows.net", "client_secret", "api-key", "sas_token", "credentials",
    "spark.hadoop.fs.s3a.session.token", "private_key"])
def test_secret_keys_are_recognised(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["keys", "primary_key", "tokenizer_model", "key_columns", "passthrough",
                                 "secretary", "schema_name", "monkey"])
def test_ordinary_keys_are_not(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize("text", [
    f"jdbc:postgresql://lakemirror:{TOKEN}@db:5432/app failed",
    f"connect to postgresql://db/app?user=x&password={TOKEN}&ssl=true",
    f"Authorization: Bearer {TOKEN}",
    f'{{"token": "{TOKEN}", "host": "h"}}',
    f"option secret_key={TOKEN}; retry",
])
def test_free_text_credentials_are_redacted(text: str) -> None:
    out = redact(text)
    assert TOKEN not in out and MASK in out


def test_redact_keeps_ordinary_text_and_masks_known_values() -> None:
    plain = "MERGE failed: [DELTA_CONCURRENT_APPEND] at version 12 of dst.sales.orders (key id=5)"
    assert redact(plain) == plain
    assert redact(f"the value {TOKEN} leaked", known=(TOKEN,)) == f"the value {MASK} leaked"
    assert redact("dapi0123456789abcdef0123456789abcdef is a PAT") == f"{MASK} is a PAT"


def test_mask_secrets_walks_nested_config() -> None:
    cfg = {"runtime": {"spark_conf": {"spark.hadoop.fs.s3a.secret.key": TOKEN, "spark.sql.shuffle.partitions": "4"}},
           "http": {"auth_token": TOKEN}, "sinks": [{"url": f"postgresql://u:{TOKEN}@h/db"}], "keys": ["id"]}
    dumped = json.dumps(mask_secrets(cfg))
    assert TOKEN not in dumped
    assert '"spark.sql.shuffle.partitions": "4"' in dumped and '"keys": ["id"]' in dumped


def test_settings_never_print_the_token(tmp_path: Path) -> None:
    s = load_settings(None, {"source_catalog": "a", "destination_catalog": "b", "schema_name": "c",
                             "checkpoint_volume": str(tmp_path), "http": {"auth_token": TOKEN}})
    assert s.http.auth_token is not None and s.http.auth_token.get_secret_value() == TOKEN
    for text in (str(s), repr(s), s.model_dump_json(), json.dumps(mask_secrets(s.model_dump()), default=str)):
        assert TOKEN not in text


def test_config_errors_do_not_echo_the_offending_value(tmp_path: Path) -> None:
    from lakemirror.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_settings(None, {"source_catalog": "a", "destination_catalog": "b", "schema_name": "c",
                             "checkpoint_volume": str(tmp_path), "http": {"auth_token": [TOKEN], "port": TOKEN}})
    assert TOKEN not in str(err.value)


def test_classified_errors_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    err = classify(RuntimeError(f"SQLException: FATAL: password authentication failed for "
                                f"jdbc:postgresql://app:{TOKEN}@db/app"), table="src.s.t")
    assert TOKEN not in str(err)
    with caplog.at_level(logging.INFO):
        logging.getLogger("lakemirror.test").warning("table failed: %s", err)
    assert TOKEN not in caplog.text


#: Inputs on which a backtracking expression takes time quadratic in their length: long words (a
#: scheme pattern restarting at each letter), words followed by ``://`` and a long user, repeated
#: keywords. At this size quadratic work takes many minutes, past the unit tier's time limit.
LONG_INPUTS = ["a" * 400_000, "password" * 50_000, "x://" + "a" * 400_000, "a://b:" + "c" * 400_000,
               "dapi" * 100_000, "s3a://" * 60_000, ("a" * 1000 + "://") * 400]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("text", LONG_INPUTS, ids=["letters", "keywords", "long user", "long password",
                                                   "pat-like", "schemes", "words and schemes"])
def test_redact_is_linear_in_its_input(text: str) -> None:
    assert redact(text) == text  # nothing to mask, and an answer in milliseconds rather than hours


def test_url_passwords_are_masked_as_the_uri_grammar_says() -> None:
    """The scan masks exactly what ``[a-z][a-z0-9+.-]*://[^/\\s:@]+:`` then ``[^@\\s/]+`` before ``@``
    matches, on every string of a small alphabet that exercises each boundary."""
    import random
    import re

    spec = re.compile(r"(?P<keep>[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+(?=@)", re.IGNORECASE)
    rng = random.Random(46)
    for _ in range(20_000):
        text = "".join(rng.choice("aZ9:/@ .-+\t") for _ in range(rng.randint(0, 24)))
        assert redact(text) == spec.sub(lambda m: m.group("keep") + MASK, text), text
    assert redact("s3a://AKIA:pw@bucket/a and jdbc:postgresql://u:p@h/db") == (
        f"s3a://AKIA:{MASK}@bucket/a and jdbc:postgresql://u:{MASK}@h/db")
    assert redact("9://u:p@h") == "9://u:p@h"  # a scheme starts with a letter
