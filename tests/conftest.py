"""Test-wide guards."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_cuda_expectation():
    """A GPU job's launcher sets DAPO_EXPECT_CUDA=1 in its own process; tests that call it in pytest's
    would hand it to every later run (and, through sbatch's environment export, to Slurm jobs), which
    would then stop for want of a GPU. Put it back after each test."""
    before = os.environ.get("DAPO_EXPECT_CUDA")
    yield
    if before is None:
        os.environ.pop("DAPO_EXPECT_CUDA", None)
    else:
        os.environ["DAPO_EXPECT_CUDA"] = before
