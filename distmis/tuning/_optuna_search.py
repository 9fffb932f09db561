"""Ray Tune's OptunaSearch, completed so that the study holds one intermediate value per epoch.

Imported only once Ray may be imported (after the private auth token is set up).
"""

from __future__ import annotations

from ray.tune.result import TRAINING_ITERATION
from ray.tune.search.optuna import OptunaSearch


class EpochReportingOptunaSearch(OptunaSearch):
    """OptunaSearch that also records a trial's last epoch as an intermediate value.

    Tune hands a trial's final result only to ``on_trial_complete``, not to
    ``on_trial_result``, so the study in ``optuna.journal`` lacked the last epoch: an E-epoch
    trial showed E-1 intermediate values in optuna-dashboard.
    """

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        metric = self.metric
        if (
            ot_trial is not None
            and result
            and not error
            and isinstance(metric, str)
            and trial_id not in self._completed_trials
            and isinstance(result.get(metric), int | float)
            and TRAINING_ITERATION in result
        ):
            step = int(result[TRAINING_ITERATION])
            if step not in ot_trial.storage.get_trial(ot_trial._trial_id).intermediate_values:
                ot_trial.report(float(result[metric]), step)
        super().on_trial_complete(trial_id, result=result, error=error)


__all__ = ["EpochReportingOptunaSearch"]
