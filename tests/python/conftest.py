"""pytest fixtures shared by tests/python: the tiny model, a daemon for it."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvt_testutil  # noqa: E402
import tinymodel  # noqa: E402


@pytest.fixture
def workdir():
    d = kvt_testutil.tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny():
    return tinymodel.TinyModel(seed=7)


@pytest.fixture
def tiny_daemon(workdir):
    """A daemon serving tinymodel's geometry with 4-token pages."""
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=4) as s:
        yield s
