"""Inference: sliding-window prediction of raw NIfTI scans, evaluation in physical units."""

from distmis.inference._evaluate import (
    EvaluationResult,
    check_cases,
    evaluate,
    score_labels,
    scored_masks,
)
from distmis.inference._model import (
    MIRROR_AXES,
    ModelRecord,
    PredictFn,
    build_model,
    build_models,
    make_predict_fn,
    read_model_record,
)
from distmis.inference._postprocess import keep_largest_components
from distmis.inference._predict import (
    CaseJob,
    CaseOutcome,
    PredictOptions,
    label_values_of,
    plan_jobs,
    predict_cases,
    predict_probabilities,
    probabilities_to_labels,
)
from distmis.inference._scores import METRICS, hausdorff95, mask_metrics, summarise
from distmis.inference._window import BLENDS, sliding_window_predict
from distmis.model import window_starts

__all__ = [
    "BLENDS",
    "METRICS",
    "MIRROR_AXES",
    "CaseJob",
    "CaseOutcome",
    "EvaluationResult",
    "ModelRecord",
    "PredictFn",
    "PredictOptions",
    "build_model",
    "build_models",
    "check_cases",
    "evaluate",
    "hausdorff95",
    "keep_largest_components",
    "make_predict_fn",
    "mask_metrics",
    "plan_jobs",
    "predict_cases",
    "predict_probabilities",
    "label_values_of",
    "probabilities_to_labels",
    "read_model_record",
    "score_labels",
    "scored_masks",
    "sliding_window_predict",
    "summarise",
    "window_starts",
]
