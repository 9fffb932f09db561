"""``python -m distmis`` = the ``distmis`` command (useful where the venv's bin is not on PATH, e.g. Ray jobs)."""

from distmis.cli import entrypoint

entrypoint()
