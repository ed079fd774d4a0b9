"""Shared fixtures: tiny seeded models and batches."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
