"""The Tune searcher over an Optuna study: ask and tell, with Tune's trial outcomes mapped to Optuna's states.

Written against Ray Tune's public ``Searcher`` interface and Optuna's public study API rather than
by subclassing Ray's ``OptunaSearch``: that class keeps its trials in a private mapping and tells
Optuna that a trial the scheduler stopped after two epochs is COMPLETE with its epoch-2 value,
so TPE ranked it against trials that trained every epoch as if the early number were final.

Here (see :meth:`OptunaSearcher.on_trial_complete`):

* a trial that trained every epoch is COMPLETE with the best value it reported (the epoch whose
  weights the search keeps in ``best/``);
* a trial the scheduler stopped early is PRUNED, with one intermediate value per epoch: TPE ranks
  every pruned trial below the completed ones and pruned trials among themselves by how far they
  got, then by their last value, which is what a pruned trial is worth;
* a trial that failed, or whose configuration could not be trained (NaN metrics), is FAIL.

Each counts the epochs results.csv counts: one whose report reached Tune after the search's
deadline is read from the trial's own ``metrics.csv`` (:meth:`OptunaSearcher._with_unreported_epochs`).

The study lives in the search's ``optuna.journal`` (Optuna's JournalStorage), so optuna-dashboard
shows it while the search runs. Tune saves the searcher with its experiment state and restores it
on ``--resume`` (:meth:`save` / :meth:`restore`): the sampler (its random state) and the map of Tune
trials to Optuna trials come back, so a resumed search goes on with the model it had built
instead of starting over with random start-up trials, and a trial resumed mid-way reports into
the same Optuna trial. Optuna trials started after the last save, which Tune does not know
about, are closed as FAIL.
"""

from __future__ import annotations

import math
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.search import Searcher

from distmis.files import open_nofollow, refuse_link
from distmis.metrics import FAILURE

if TYPE_CHECKING:
    import optuna

    from distmis.tuning.space import DefineByRun


class OptunaSearcher(Searcher):
    """Suggest configurations from an Optuna study kept in a journal file.

    Args:
        space: the define-by-run sampler of the search space.
        metric, mode: what the search optimises.
        sampler: Optuna's sampler (TPE, random).
        journal: the study's JournalStorage file.
        study_name: the study in it.
        max_epochs: a trial that reports fewer epochs than this was stopped by the scheduler.
        points_to_evaluate: configurations tried first, in order (Optuna's ``enqueue_trial``).
        trials_dir: the search's ``trials/`` folder, where each trial keeps its own ``metrics.csv``:
            an epoch the trial wrote whose report Tune dropped (it came after the search's deadline)
            is told to the study too, as results.csv counts it.
    """

    def __init__(
        self,
        *,
        space: DefineByRun,
        metric: str,
        mode: str,
        sampler: optuna.samplers.BaseSampler,
        journal: str | Path,
        study_name: str,
        max_epochs: int,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        trials_dir: str | Path | None = None,
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        self._space = space
        self._sampler = sampler
        self._journal = str(journal)
        self._study_name = study_name
        self._max_epochs = max_epochs
        self._points = list(points_to_evaluate or [])
        self._trials_dir = None if trials_dir is None else str(trials_dir)
        self._numbers: dict[str, int] = {}  # Tune trial id -> Optuna trial number
        self._finished: set[str] = set()
        self._study_cache: optuna.Study | None = None
        self._storage_cache: optuna.storages.BaseStorage | None = None
        self._trial_cache: dict[str, optuna.Trial] = {}

    # ------------------------------------------------------------------ the study
    @property
    def _study(self) -> optuna.Study:
        if self._study_cache is None:
            import optuna
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            refuse_link(self._journal, what="Optuna journal")  # Optuna opens it itself, following links

            storage = self._storage_cache = JournalStorage(JournalFileBackend(self._journal))
            study = optuna.create_study(
                storage=storage,
                sampler=self._sampler,
                study_name=self._study_name,
                direction="maximize" if self._mode == "max" else "minimize",
                load_if_exists=True,
            )
            if self._points and not study.trials:  # first start only: a resumed study has them already
                for point in self._points:
                    study.enqueue_trial(self._space.encoded(point), skip_if_exists=True)
            self._study_cache = study
        return self._study_cache

    @property
    def _storage(self) -> optuna.storages.BaseStorage:
        if self._storage_cache is None:
            self._study  # noqa: B018 - opens the storage with the study
        assert self._storage_cache is not None
        return self._storage_cache

    def _storage_id(self, number: int) -> int:
        """The storage's id of trial ``number`` of this study (Optuna's public storage API)."""
        storage = self._storage
        return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(self._study_name), number)

    def _trial(self, trial_id: str) -> optuna.Trial | None:
        """The Optuna trial behind a Tune trial (rebuilt from the journal after a restore)."""
        if trial_id in self._trial_cache:
            return self._trial_cache[trial_id]
        number = self._numbers.get(trial_id)
        if number is None:
            return None
        import optuna

        trial = optuna.trial.Trial(self._study, self._storage_id(number))
        self._trial_cache[trial_id] = trial
        return trial

    def _intermediate_values(self, number: int) -> dict[int, float]:
        return dict(self._storage.get_trial(self._storage_id(number)).intermediate_values)

    # ------------------------------------------------------------------ Tune's calls
    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        with warnings.catch_warnings():
            # the sampler's own notes (e.g. the experimental multivariate TPE) are not the user's business
            warnings.simplefilter("ignore")
            trial = self._study.ask()
            decoded = self._space(trial)
        self._numbers[trial_id] = trial.number
        self._trial_cache[trial_id] = trial
        return {**trial.params, **(decoded or {})}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self._report(trial_id, result)

    def _already_told(self, trial_id: str) -> bool:
        """Whether the study already holds this trial as finished. A driver killed after telling Optuna
        and before Tune saved its state resumes with the trial unfinished in Tune's eyes; the journal is
        the truth, and a finished Optuna trial cannot be told again."""
        if trial_id in self._finished:
            return True
        number = self._numbers.get(trial_id)
        trials = self._study.get_trials(deepcopy=False)
        if number is not None and number < len(trials) and trials[number].state.is_finished():
            self._finished.add(trial_id)
            self._trial_cache.pop(trial_id, None)
            return True
        return False

    def _report(self, trial_id: str, result: dict[str, Any] | None) -> None:
        """One intermediate value per epoch (the epoch is the step; each is written once)."""
        if not result or self._already_told(trial_id):
            return
        trial = self._trial(trial_id)
        value, step = result.get(self._metric), result.get("epoch")
        if trial is None or not isinstance(value, (int, float)) or not isinstance(step, (int, float)):
            return
        if math.isfinite(value) and int(step) >= 1 and int(step) not in self._intermediate_values(trial.number):
            trial.report(float(value), int(step))

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if trial_id not in self._numbers or self._already_told(trial_id):
            return
        from optuna.trial import TrialState

        result = self._with_unreported_epochs(trial_id, result)
        self._report(trial_id, result)
        number = self._numbers[trial_id]
        values = list(self._intermediate_values(number).values())
        epochs = int((result or {}).get("epoch") or 0)
        finite = [v for v in values if math.isfinite(v)]
        failure = (result or {}).get(FAILURE)
        if error or failure or not finite:
            trial = self._trial(trial_id)
            if failure and trial is not None:
                trial.set_user_attr(FAILURE, str(failure))  # why, beside the state, in the journal
            self._study.tell(number, state=TrialState.FAIL)
        elif epochs < self._max_epochs:
            self._study.tell(number, state=TrialState.PRUNED)  # Optuna keeps the last value as the trial's
        else:
            best = max(finite) if self._mode == "max" else min(finite)
            self._study.tell(number, best)
        self._finished.add(trial_id)
        self._trial_cache.pop(trial_id, None)

    def _with_unreported_epochs(self, trial_id: str, result: dict[str, Any] | None) -> dict[str, Any] | None:
        """``result`` completed by the epochs the trial wrote after it, each told as an intermediate value.

        Tune calls :meth:`on_trial_complete` with the last report it heard, which after a deadline can
        be one epoch short of the trial's ``metrics.csv`` and ``best/``; results.csv and MLflow count
        that epoch (:func:`~distmis.tuning._results.with_unreported_epochs`), and so does the study.
        Every such epoch is on disk by now: a trial keeps only epochs that end before the deadline.
        """
        if self._trials_dir is None:
            return result
        from distmis.tuning._results import unreported_epochs, with_unreported_epochs

        heard = result or {}
        late = unreported_epochs(Path(self._trials_dir) / trial_id, int(heard.get("epoch") or 0))
        if not late:
            return result
        completed, reported = with_unreported_epochs(heard, late, self._metric or "")
        for row in reported:
            self._report(trial_id, row)
        return completed

    # ------------------------------------------------------------------ saved with Tune's experiment state
    def _state(self) -> dict[str, Any]:
        return {
            "numbers": dict(self._numbers),
            "finished": sorted(self._finished),
            "sampler": self._sampler,
            "journal": self._journal,
            "study_name": self._study_name,
        }

    def save(self, checkpoint_path: str) -> None:
        with open_nofollow(checkpoint_path, "wb") as fh:
            pickle.dump(self._state(), fh)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as fh:
            state = pickle.load(fh)
        self._numbers = dict(state["numbers"])
        self._finished = set(state["finished"])
        self._sampler = state["sampler"]
        self._study_cache, self._storage_cache, self._trial_cache = None, None, {}
        self._close_unknown_trials()

    def _close_unknown_trials(self) -> None:
        """Optuna trials still RUNNING that Tune never saved: their driver died before the next save."""
        from optuna.trial import TrialState

        known = set(self._numbers.values())
        for frozen in self._study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if frozen.number not in known:
                self._study.tell(frozen.number, state=TrialState.FAIL)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the searcher into tuner.pkl: no open storage, no live trial objects
        state = dict(self.__dict__)
        state["_study_cache"], state["_storage_cache"], state["_trial_cache"] = None, None, {}
        return state


def build_sampler(algorithm: str, seed: int, startup_trials: int) -> optuna.samplers.BaseSampler:
    """Optuna's sampler for ``search.algorithm``: ``optuna`` (TPE), ``random``, ``gp`` or ``cmaes``."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if algorithm == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if algorithm == "gp":
            # GP conditions on the running trials' pending points itself (Optuna 5), so concurrent
            # trials get different proposals without a constant liar
            return optuna.samplers.GPSampler(
                seed=seed, n_startup_trials=startup_trials, warn_independent_sampling=False
            )
        if algorithm == "cmaes":
            # CMA-ES moves only the numeric parameters; a categorical one is drawn at random, which
            # is what independent sampling means here, so it is not warned about per trial
            return optuna.samplers.CmaEsSampler(
                seed=seed,
                n_startup_trials=startup_trials,
                independent_sampler=optuna.samplers.RandomSampler(seed=seed),
                warn_independent_sampling=False,
            )
        # constant_liar: concurrent trials see each other as pending, so TPE does not propose the
        # same point to every free worker; multivariate + group model the parameters jointly and
        # handle conditional spaces
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=startup_trials,
            multivariate=True,
            group=True,
            constant_liar=True,
        )


__all__ = ["OptunaSearcher", "build_sampler"]
