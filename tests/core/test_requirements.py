"""A test's missing PostgreSQL or browser skips it with what to install, and fails it in CI."""

from __future__ import annotations

import pytest

from agentbolt.testing.requirements import in_ci, require


@pytest.mark.parametrize("value", ["", "0", "false", "False", "no"])
def test_outside_ci_a_missing_requirement_skips_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match=r"^/usr/bin/chromium not found \(apt-get install chromium\); "):
        require(False, "/usr/bin/chromium", "apt-get install chromium")


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_in_ci_a_missing_requirement_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(
        pytest.fail.Exception, match=r"^PostgreSQL binaries not found \(apt-get install postgresql\); CI="
    ):
        require(False, "PostgreSQL binaries", "apt-get install postgresql")


def test_a_present_requirement_neither_skips_nor_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    require(True, "PostgreSQL binaries", "apt-get install postgresql")
    monkeypatch.delenv("CI")
    assert not in_ci()
    require(True, "PostgreSQL binaries", "apt-get install postgresql")
