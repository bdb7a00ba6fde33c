"""Ray Serve's start-up wait is read and checked before Ray starts (no Ray needed here)."""

import pytest

from hybrid_retrieval.cluster.serve import START_TIMEOUT_VARIABLE, start_timeout
from hybrid_retrieval.common.errors import ConfigError


def test_the_start_timeout_is_the_variable_or_600_s_and_refuses_what_is_not_a_duration(monkeypatch):
    monkeypatch.delenv(START_TIMEOUT_VARIABLE, raising=False)
    assert start_timeout() == 600.0
    monkeypatch.setenv(START_TIMEOUT_VARIABLE, " 1800 ")
    assert start_timeout() == 1800.0
    for bad in ("0", "-5", "ten", "nan", "inf"):
        monkeypatch.setenv(START_TIMEOUT_VARIABLE, bad)
        with pytest.raises(ConfigError, match=f"HYBRID_RAY_START_TIMEOUT must be a number of seconds > 0, got '{bad}'"):
            start_timeout()
