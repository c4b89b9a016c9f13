"""``--lease-ttl`` is a finite, positive number of seconds: NaN made every expiry comparison
false (a lease that never expired, accepted without a word), infinity a lease that never does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.config import PipelineConfig


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5", "1e9"])
def test_a_lease_ttl_that_is_not_a_finite_positive_number_is_one_clear_error(
        value: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pipeline", "run", "x", "-o", "never-written",
                          f"--lease-ttl={value}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "error: --lease-ttl must be a finite number of seconds" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_config_refuses_it_too() -> None:
    with pytest.raises(ValueError, match="--lease-ttl must be a finite number"):
        PipelineConfig(lease_ttl=float("nan"))
    assert PipelineConfig(lease_ttl=30).lease_ttl == 30
