"""Shared fixtures: tiny seeded models and batches."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory):
    """A user cache of the test run's own: probes saved there by one test (or by the user's
    own ``iclprobe probe``) never reach another test's `align` (tests may set their own)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ICLPROBE_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield
