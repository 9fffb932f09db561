"""Inference: sliding-window prediction of raw NIfTI scans, evaluation in physical units."""

from distmis.inference._evaluate import (
    EvaluationResult,
    check_cases,
    evaluate,
    evaluation_cases,
    score_labels,
    scored_masks,
    search_tracking,
)
from distmis.inference._metrics import METRICS, hausdorff95, mask_metrics, summarise
from distmis.inference._model import (
    ENSEMBLE,
    MIRROR_AXES,
    ModelRecord,
    PredictFn,
    build_model,
    build_models,
    make_predict_fn,
    read_model_record,
)
from distmis.inference._postprocess import keep_largest_components, largest_component
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
from distmis.inference._window import BLENDS, sliding_window_predict
from distmis.model import cube_origins, gaussian_weight, window_starts

__all__ = [
    "BLENDS",
    "ENSEMBLE",
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
    "cube_origins",
    "evaluate",
    "evaluation_cases",
    "gaussian_weight",
    "hausdorff95",
    "keep_largest_components",
    "largest_component",
    "make_predict_fn",
    "mask_metrics",
    "plan_jobs",
    "predict_case",
    "predict_cases",
    "predict_probabilities",
    "probabilities_to_labels",
    "read_model_record",
    "score_labels",
    "scored_masks",
    "search_tracking",
    "sliding_window_predict",
    "summarise",
    "window_starts",
]
