"""Data: MSD NIfTI datasets, synthetic data, preparation into chunked per-case arrays, tf.data loading read on demand."""

from distmis.data._augment import INTENSITY_CHANCES
from distmis.data._augment import context_size as augment_context_size
from distmis.data._augment import intensity as augment_intensity
from distmis.data._augment import intensity_parameters as augment_intensity_parameters
from distmis.data._augment import resample_from_context as augment_from_context
from distmis.data._augment import spatial as augment_spatial
from distmis.data._augment import spatial_parameters as augment_spatial_parameters
from distmis.data._cases import CaseReader, write_case
from distmis.data._folds import cv_cases, fold_groups, fold_view, label_presence
from distmis.data._inspect import activation_bytes, fingerprint, overview_png
from distmis.data._inspect import suggest as suggest_patch
from distmis.data._loader import PatchSampler, augment, eval_batches, make_dataset, pipeline_errors, verify_cases
from distmis.data._msd import (
    MsdCase,
    MsdDataset,
    case_id_of,
    check_case_files,
    check_case_headers,
    geometry_difference,
    load_case_image,
    load_case_label,
    load_nifti,
    load_nifti_header,
    read_dataset_json,
)
from distmis.data._normalize import SCHEMES as NORMALIZATIONS
from distmis.data._normalize import channel_schemes, is_ct, normalize, zscore_nonzero
from distmis.data._normalize import describe as describe_normalisation
from distmis.data._plan import (
    AT_ONCE_KEPT_SHARE,
    AT_ONCE_TRIAL_STEPS,
    FINALIZE_ROUND_TRIAL_STEPS,
    MIN_TRIAL_STEPS,
    ROUND_TRIAL_STEPS,
    SEARCH_SHARE,
    TRAINING_SHARE,
    PlanOptions,
    conv_work,
    dataset_text,
    plan_search,
    plan_topology,
    relative_source,
    unplannable,
)
from distmis.data._plan import HEADER as INIT_HEADER
from distmis.data._prepare import (
    crop_or_pad,
    prepare_dataset,
    preprocess_image,
    preprocess_label,
    resample,
    split_cases,
)
from distmis.data._record import (
    FORMAT,
    ChannelNormalisation,
    Manifest,
    ModelPreprocessing,
    PreparedInfo,
    Preprocessing,
    load_manifest,
)
from distmis.data._resolve import resolve_prepared
from distmis.data._splits import SPLITS_FILE, CaseSplits, check_same_splits, read_search_splits
from distmis.data._synth import LABELS as SYNTH_LABELS
from distmis.data._synth import synth_case, write_synthetic_msd
from distmis.data._visualize import read_case, render_case

__all__ = [
    "INTENSITY_CHANCES",
    "activation_bytes",
    "suggest_patch",
    "augment_context_size",
    "augment_from_context",
    "augment_intensity",
    "augment_intensity_parameters",
    "augment_spatial",
    "augment_spatial_parameters",
    "INIT_HEADER",
    "MIN_TRIAL_STEPS",
    "AT_ONCE_KEPT_SHARE",
    "AT_ONCE_TRIAL_STEPS",
    "FINALIZE_ROUND_TRIAL_STEPS",
    "ROUND_TRIAL_STEPS",
    "PlanOptions",
    "SEARCH_SHARE",
    "TRAINING_SHARE",
    "plan_search",
    "plan_topology",
    "conv_work",
    "relative_source",
    "SPLITS_FILE",
    "CaseSplits",
    "check_same_splits",
    "read_search_splits",
    "NORMALIZATIONS",
    "SYNTH_LABELS",
    "Manifest",
    "PreparedInfo",
    "Preprocessing",
    "ModelPreprocessing",
    "ChannelNormalisation",
    "PatchSampler",
    "CaseReader",
    "FORMAT",
    "MsdCase",
    "MsdDataset",
    "augment",
    "case_id_of",
    "channel_schemes",
    "is_ct",
    "check_case_files",
    "check_case_headers",
    "crop_or_pad",
    "cv_cases",
    "dataset_text",
    "describe_normalisation",
    "eval_batches",
    "fingerprint",
    "fold_groups",
    "fold_view",
    "geometry_difference",
    "label_presence",
    "load_case_image",
    "load_case_label",
    "load_manifest",
    "load_nifti",
    "load_nifti_header",
    "make_dataset",
    "normalize",
    "overview_png",
    "prepare_dataset",
    "preprocess_image",
    "preprocess_label",
    "read_case",
    "read_dataset_json",
    "render_case",
    "resample",
    "resolve_prepared",
    "split_cases",
    "synth_case",
    "verify_cases",
    "write_case",
    "write_synthetic_msd",
    "zscore_nonzero",
    "unplannable",
    "pipeline_errors",
]
