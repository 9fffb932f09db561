"""Optuna studies as the search's journal file holds them, read the way optuna-dashboard reads them.

Tests open the journal themselves, rather than through distmis, so that what they check is the file
a user's tools see, not distmis's view of it.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend


def journal_storage(journal: Path) -> JournalStorage:
    """The storage of an Optuna journal file (created if it does not exist)."""
    return JournalStorage(JournalFileBackend(str(journal)))


def journal_study(journal: Path, name: str | None = None) -> optuna.Study:
    """The study ``name`` in ``journal``; without a name, the one study it holds."""
    return optuna.load_study(study_name=name, storage=journal_storage(journal))
