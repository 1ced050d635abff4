"""What the tests share that is neither a test nor a fixture, one concept per module."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the working directory and ``PYTHONPATH`` of the processes tests start."""
