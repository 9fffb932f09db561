"""Inference: sliding-window prediction of raw NIfTI scans, evaluation in physical units."""

from distmis.inference._evaluate import EvaluationResult, evaluate, evaluation_cases, search_tracking
from distmis.inference._metrics import METRICS, hausdorff95, mask_metrics, summarise
from distmis.inference._model import ModelRecord, build_model, make_predict_fn, read_model_record
from distmis.inference._predict import (
    CaseJob,
    CaseOutcome,
    PredictOptions,
    plan_jobs,
    predict_case,
    predict_cases,
    predict_probabilities,
    probabilities_to_labels,
)
from distmis.inference._window import BLENDS, cube_origins, gaussian_weight, sliding_window_predict, window_starts

__all__ = [
    "BLENDS",
    "METRICS",
    "CaseJob",
    "CaseOutcome",
    "EvaluationResult",
    "ModelRecord",
    "PredictOptions",
    "build_model",
    "cube_origins",
    "evaluate",
    "evaluation_cases",
    "gaussian_weight",
    "hausdorff95",
    "make_predict_fn",
    "mask_metrics",
    "plan_jobs",
    "predict_case",
    "predict_cases",
    "predict_probabilities",
    "probabilities_to_labels",
    "read_model_record",
    "search_tracking",
    "sliding_window_predict",
    "summarise",
    "window_starts",
]
