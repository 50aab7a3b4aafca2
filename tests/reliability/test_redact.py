"""Secret masking (:mod:`accelmux.redact`): a secret in any of the masked shapes never
survives, masking is idempotent, and text without secrets is left alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from accelmux.redact import MASK, redact

SECRET = st.text(
    alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd"), whitelist_characters="-_.~+"),
    min_size=6,
    max_size=40,
).filter(lambda s: s.strip("-_.~+") != "")
NAME = st.sampled_from(
    ["HF_TOKEN", "OPENAI_API_KEY", "db_password", "CLIENT_SECRET", "passwd", "x-auth", "apikey"]
)
WORDS = st.lists(
    st.sampled_from(["listening", "on", "port", "8080", "model", "loaded", "PATH=/usr/bin", "n=4"]),
    max_size=6,
).map(" ".join)


@given(secret=SECRET, name=NAME, before=WORDS, after=WORDS)
def test_an_assignment_of_a_secret_name_is_masked(
    secret: str, name: str, before: str, after: str
) -> None:
    for shape in (f"{name}={secret}", f'"{name}": "{secret}"', f"--{name.lower()} {secret}"):
        out = redact(f"{before} {shape} {after}")
        assert secret not in out, (shape, out)
        assert MASK in out
        assert redact(out) == out


@given(user=SECRET, password=SECRET, token=SECRET, path=WORDS)
def test_url_credentials_and_query_secrets_are_masked(
    user: str, password: str, token: str, path: str
) -> None:
    url = f"rtsp://{user}:{password}@cam.local:554/live?password={password}&token={token}&ch=1"
    out = redact(f"{path} cannot open {url}")
    assert password not in out and token not in out and f"{user}:" not in out, out
    assert "cam.local:554/live" in out and "ch=1" in out
    assert redact(out) == out


@given(token=SECRET)
def test_bearer_tokens_are_masked(token: str) -> None:
    out = redact(f"Authorization: Bearer {token}")
    assert token not in out


@given(text=WORDS)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text
    assert redact("http://example.org:8080/v1/models?limit=5") == (
        "http://example.org:8080/v1/models?limit=5"
    )
