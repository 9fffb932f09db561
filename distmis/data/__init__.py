"""Data: MSD NIfTI datasets, synthetic data, preparation into TFRecords, tf.data loading."""

from distmis.data._loader import Manifest, eval_batches, load_manifest, make_dataset, verify_shards
from distmis.data._msd import MsdDataset, load_case_image, load_nifti, read_dataset_json
from distmis.data._prepare import (
    MANIFEST,
    crop_or_pad,
    prepare_dataset,
    preprocess_image,
    preprocess_label,
    split_cases,
    zscore_nonzero,
)
from distmis.data._resolve import resolve_prepared
from distmis.data._synth import write_synthetic_msd
from distmis.data._visualize import read_case, render_case

__all__ = [
    "MANIFEST",
    "Manifest",
    "MsdDataset",
    "crop_or_pad",
    "eval_batches",
    "load_case_image",
    "load_manifest",
    "load_nifti",
    "make_dataset",
    "prepare_dataset",
    "preprocess_image",
    "preprocess_label",
    "read_case",
    "read_dataset_json",
    "render_case",
    "resolve_prepared",
    "split_cases",
    "verify_shards",
    "write_synthetic_msd",
    "zscore_nonzero",
]
