"""KServe's virtualenv: the make target named when it is missing, before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelroll_devcluster.controlplane import MissingBinaryError
from modelroll_devcluster.kserve import KServe, python


def test_a_missing_virtualenv_names_the_make_target(tmp_path: Path) -> None:
    with pytest.raises(MissingBinaryError, match="`make kserve`"):
        python(tmp_path)


def test_a_virtualenv_pip_has_not_finished_is_missing(tmp_path: Path) -> None:
    (tmp_path / ".venv-kserve" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-kserve" / "bin" / "python").touch()
    with pytest.raises(MissingBinaryError, match="`make kserve`"):
        python(tmp_path)


def test_the_server_listens_on_loopback_at_its_own_port(tmp_path: Path) -> None:
    one, other = KServe(tmp_path, tmp_path), KServe(tmp_path, tmp_path)
    assert one.url.startswith("http://127.0.0.1:")
    assert one.port != other.port
