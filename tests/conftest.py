import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# Written by upstream nanochat's own code and kept in the repository (see its README), so a
# clone passes its tests with nothing beside it.
FIXTURE = Path(os.environ.get("SMEARCLI_FIXTURE", ROOT / "tests" / "fixtures" / "nanochat-d4-bytes"))


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    if not (FIXTURE / "reference.pt").is_file():
        pytest.fail(f"upstream fixture not found at {FIXTURE} (set SMEARCLI_FIXTURE)")
    return FIXTURE


@pytest.fixture(scope="session")
def reference(fixture_dir):
    return torch.load(fixture_dir / "reference.pt", weights_only=True)


@pytest.fixture(scope="session")
def upstream_model(fixture_dir):
    from smearcli.weights import load_checkpoint
    return load_checkpoint(fixture_dir).model
