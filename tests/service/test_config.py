"""ServiceConfig travels to the granian worker through the environment."""

from __future__ import annotations

import pytest

from service.config import CONFIG_ENV, ServiceConfig, base_url


def test_round_trip_through_the_environment() -> None:
    config = ServiceConfig(model="/m", max_active=3, max_iteration_tokens=64, port=9, extra={"speech": {"model": "w"}})
    assert ServiceConfig.from_env({CONFIG_ENV: config.to_json()}) == config


def test_the_clis_config_wins_over_single_variables_and_unknown_keys_are_ignored() -> None:
    # A leftover TANDEM_MAX_ACTIVE beat --max-active, TANDEM_MODEL the model the CLI had resolved and announced.
    env = {CONFIG_ENV: '{"model": "a", "max_active": 2, "from_the_future": 1}', "TANDEM_MODEL": "b",
           "TANDEM_MAX_ACTIVE": "8"}
    config = ServiceConfig.from_env(env)
    assert (config.model, config.max_active) == ("a", 2)


def test_single_variables_configure_an_app_started_without_the_cli() -> None:
    config = ServiceConfig.from_env({"TANDEM_MODEL": "b", "TANDEM_MAX_ITERATION_TOKENS": "128"})
    assert (config.model, config.max_iteration_tokens) == ("b", 128)


@pytest.mark.parametrize("env", [{CONFIG_ENV: "{nope"}, {"TANDEM_MAX_ACTIVE": "many"}])
def test_malformed_values_raise_value_error(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        ServiceConfig.from_env(env)


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:8080"),
    ("localhost", "http://localhost:8080"),
    ("::1", "http://[::1]:8080"),  # unbracketed, "::1:8080" reads as a port and httpx refuses the URL
    ("[::1]", "http://[::1]:8080"),
])
def test_base_url_brackets_an_ipv6_host(host: str, url: str) -> None:
    assert base_url(host, 8080) == url
