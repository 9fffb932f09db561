"""Predict raw NIfTI scans with a trained model: preprocessing as in training, sliding-window
inference, output in the source geometry, one case per Ray task when a cluster is there.

Geometry: with ``resize: resample`` the model was trained on volumes resampled to the
recorded shape, so the scan is resampled the same way and the class probabilities are
resampled back before thresholding. With ``resize: crop_pad`` training only cropped or padded
(the voxel grid was not changed), so the whole scan is predicted directly by sliding windows
(the U-Net is fully convolutional) and nothing needs undoing: unlike re-applying the crop,
this also predicts the voxels that the crop cut off. Either way the written segmentation has
the source image's spatial shape, affine and header.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distmis.data import case_id_of, load_case_image, normalize, resample
from distmis.exceptions import DistmisError, InferenceError, OutputError
from distmis.files import atomic_file, check_output, check_replaceable, disk_failure
from distmis.inference._model import ModelRecord, build_models, make_predict_fn, read_model_record
from distmis.inference._postprocess import keep_largest_components
from distmis.inference._window import BLENDS, sliding_window_predict


@dataclass(frozen=True)
class PredictOptions:
    """How to cut a volume into cubes (``patch`` None: the cube the model was trained on)."""

    patch: tuple[int, int, int] | None = None
    overlap: float = 0.5
    blend: str = "gaussian"
    batch_size: int = 2
    threshold: float = 0.5
    #: test-time mirroring: every cube predicted under the 8 mirrorings of its axes, averaged
    #: (None: the model's own choice; a finalize's ensemble mirrors, a single model does not)
    tta: bool | None = None

    def mirrored(self, record: ModelRecord) -> bool:
        return record.tta if self.tta is None else self.tta

    def resolved_patch(self, record: ModelRecord) -> tuple[int, int, int]:
        patch = tuple(self.patch) if self.patch is not None else record.default_patch
        divisors = record.divisors
        if any(p % d for p, d in zip(patch, divisors, strict=True)):
            if len(set(divisors)) == 1:
                expected = f"{divisors[0]} (2^(model.depth-1) for a depth-{record.config.model.depth} U-Net)"
            else:
                expected = f"its axis's figure in {list(divisors)} (the model's pools)"
            raise InferenceError(f"--patch {list(patch)}: every side must be a multiple of {expected}")
        return patch  # type: ignore[return-value]

    def check(self) -> None:
        if not 0.0 <= self.overlap < 1.0:
            raise InferenceError(f"--overlap must be in [0, 1), got {self.overlap}")
        if self.blend not in BLENDS:
            raise InferenceError(f"--blend must be one of {list(BLENDS)}, got {self.blend!r}")
        if self.batch_size < 1:
            raise InferenceError(f"--batch must be >= 1, got {self.batch_size}")


@dataclass
class CaseJob:
    case_id: str
    image: Path
    out: Path


@dataclass
class CaseOutcome:
    case_id: str
    image: str
    out: str | None
    error: str | None = None
    seconds: float = 0.0
    shape: list[int] = field(default_factory=list)
    cubes: int = 0
    worker: str = ""
    network_seconds: float = 0.0  # of ``seconds``, the time in the network
    passes: int = 1  # network passes per cube: mirrorings x ensemble members
    #: the disk failed (full, over quota, read-only, EIO): every later case would fail the same way
    disk_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- one volume
def model_declares(record: ModelRecord) -> str:
    """Who expects a scan's channel count: the model, with its modalities (for errors)."""
    return f"the model {record.directory} ({', '.join(record.preprocessing.modalities)})"


def predict_probabilities(
    image: np.ndarray,
    record: ModelRecord,
    predict: Callable[[np.ndarray], np.ndarray],
    options: PredictOptions,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Raw image (X, Y, Z, C) -> class probabilities (X, Y, Z, K) in the same voxel grid."""
    spatial = image.shape[:3]
    x = normalize(image, record.preprocessing.normalisation_spec)
    if record.preprocessing.resize == "resample":
        x = resample(x, record.training_shape, order=1)
    probs = sliding_window_predict(
        x,
        predict,
        patch=options.resolved_patch(record),
        overlap=options.overlap,
        blend=options.blend,
        batch_size=options.batch_size,
        progress=progress,
    )
    if probs.shape[:3] != spatial:
        probs = resample(probs, spatial, order=1)  # type: ignore[arg-type]
    return probs


def probabilities_to_labels(
    probs: np.ndarray,
    threshold: float = 0.5,
    regions: dict[str, list[int]] | None = None,
    values: list[int] | None = None,
) -> np.ndarray:
    """Binary model: foreground (1) where p > threshold. Multi-class: the argmax class, written as the
    dataset's own label value (``values``: one per class, see :func:`distmis.labels.class_values`).
    Region model (``regions``): each region where p > threshold, written back as MSD label values
    (ET -> 3, TC without ET -> 2, WT without TC -> 1), so the file overlays like a ground truth."""
    if regions:
        from distmis.labels import labels_from_regions

        return labels_from_regions(probs > threshold, regions)
    if probs.shape[-1] == 1:
        return (probs[..., 0] > threshold).astype(np.uint8)
    classes = np.argmax(probs, axis=-1)
    return (np.asarray(values, np.uint8)[classes] if values is not None else classes).astype(np.uint8)


def label_values_of(record: ModelRecord) -> list[int]:
    """The dataset's label value of each of the model's classes (its ``preprocessing.json``)."""
    from distmis.labels import class_values

    return class_values(record.preprocessing.label_names, record.preprocessing.num_classes)


def write_segmentation(labels: np.ndarray, affine: np.ndarray, header: Any, out: Path) -> None:
    """Write labels with the source's affine and header (uint8, 3D), atomically.

    The header's ``descrip`` says ``distmis predict``: that is how a later ``--overwrite``
    tells a segmentation distmis wrote from a scan it must never replace.
    """
    import nibabel as nib

    from distmis import __version__

    header = header.copy()
    header.set_data_dtype(np.uint8)
    img = nib.Nifti1Image(labels.astype(np.uint8), affine, header=header)
    img.header.set_slope_inter(1.0, 0.0)
    img.header["descrip"] = f"distmis predict {__version__}".encode()[:79]
    with atomic_file(out) as tmp:
        nib.save(img, str(tmp))


def predict_case(
    job: CaseJob,
    record: ModelRecord,
    predict: Callable[[np.ndarray], np.ndarray],
    options: PredictOptions,
    progress: Callable[[int, int], None] | None = None,
) -> CaseOutcome:
    """Predict one scan and write its segmentation; errors become the outcome, nothing is written."""
    start = time.perf_counter()
    network_before = getattr(predict, "seconds", 0.0)
    outcome = CaseOutcome(job.case_id, str(job.image), None, worker=f"{os.uname().nodename}:{os.getpid()}")
    try:
        image, affine, header = load_case_image(job.image, record.channels, expected_by=model_declares(record))
        outcome.shape = list(image.shape)

        def counted(done: int, total: int) -> None:
            outcome.cubes = total
            if progress is not None:
                progress(done, total)

        probs = predict_probabilities(image, record, predict, options, counted)
        labels = probabilities_to_labels(
            probs, options.threshold, record.preprocessing.trained_regions, label_values_of(record)
        )
        if record.largest_component:  # an ensemble's post-processing, chosen by cross-validation
            labels = keep_largest_components(labels, record.largest_component)
        write_segmentation(labels, affine, header, job.out)
        outcome.out = str(job.out)
    except DistmisError as exc:
        outcome.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - a bug or a TensorFlow error on this case: report it, go on with the others
        outcome.disk_error = disk_failure(exc)
        outcome.error = (
            outcome.disk_error or f"{job.image}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        )
    outcome.seconds = time.perf_counter() - start
    outcome.network_seconds = getattr(predict, "seconds", 0.0) - network_before
    outcome.passes = int(getattr(predict, "passes", 1))
    return outcome


# --------------------------------------------------------------------------- many cases
def _is_nifti(path: Path) -> bool:
    return path.name.endswith((".nii.gz", ".nii")) and not path.name.startswith(".")


def plan_jobs(inputs: Path, out: Path, *, model_dir: Path | None = None, overwrite: bool = False) -> list[CaseJob]:
    """Input file -> one job (OUT a .nii/.nii.gz file or a directory); input directory -> every
    NIfTI in it (hidden and macOS ``._`` files skipped), written as OUT/<same name>.

    OUT must not be, contain or lie inside the input or the model, and no output may replace
    a file distmis did not write (a scan); one distmis wrote is replaced only with ``overwrite``.

    Raises:
        InferenceError: missing input or nothing to predict.
        OutputError: OUT would destroy an input, or replace a file it may not.
    """
    check_output(out, option="--out", inputs={"input scans": inputs, "model": model_dir})
    jobs = _plan(inputs, out)
    for job in jobs:
        check_replaceable(job.out, option="--out", overwrite=overwrite)
    return jobs


def _plan(inputs: Path, out: Path) -> list[CaseJob]:
    nifti_out = out.name.endswith((".nii.gz", ".nii"))
    if out.exists() and not out.is_dir() and not (nifti_out and out.is_file()):
        what = "a file" if out.is_file() else "not a regular file or a directory"
        raise InferenceError(f"--out {out}: exists and is {what}; give a directory, or a .nii/.nii.gz file to write")
    if inputs.is_file():
        if not _is_nifti(inputs):
            raise InferenceError(f"{inputs}: expected a .nii or .nii.gz image")
        target = out if out.name.endswith((".nii.gz", ".nii")) else out / f"{case_id_of(inputs)}.nii.gz"
        return [CaseJob(case_id_of(inputs), inputs, target)]
    if inputs.is_dir():
        files = sorted(p for p in inputs.iterdir() if p.is_file() and _is_nifti(p))
        if not files:
            raise InferenceError(f"{inputs}: no .nii/.nii.gz images in this directory")
        if out.name.endswith((".nii.gz", ".nii")):
            raise InferenceError(f"--out {out}: must be a directory when predicting the directory {inputs}")
        return [CaseJob(case_id_of(p), p, out / f"{case_id_of(p)}.nii.gz") for p in files]
    raise InferenceError(f"{inputs}: no such file or directory")


class _LocalPredictor:
    """Builds the model once and predicts cases one after another (also the Ray actor's body)."""

    def __init__(self, model_dir: str, options: PredictOptions, threads: int | None) -> None:
        from distmis.training import configure_tensorflow

        configure_tensorflow(threads)
        self.record = read_model_record(model_dir)
        self.options = options
        self.predict = make_predict_fn(build_models(self.record), tta=options.mirrored(self.record))

    def run(self, job: CaseJob, progress: Callable[[int, int], None] | None = None) -> CaseOutcome:
        return predict_case(job, self.record, self.predict, self.options, progress)


def predict_cases(
    model_dir: str | Path,
    jobs: list[CaseJob],
    options: PredictOptions,
    *,
    workers: int | None = None,
    address: str | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float | None = None,
    on_done: Callable[[CaseOutcome, int, int], None] | None = None,
) -> list[CaseOutcome]:
    """Predict every job; returns one outcome per job, in job order.

    Without a Ray cluster (no ``address``/``RAY_ADDRESS``) and ``workers`` <= 1 the cases run
    in this process. Otherwise each of ``workers`` Ray actors (``cpus_per_worker`` CPUs and
    ``gpus_per_worker`` GPUs each; default one GPU when the cluster has GPUs) loads the model
    once and takes cases from a shared queue.
    """
    record = read_model_record(model_dir)  # fail once, before any case, for a bad model directory
    options.check()
    options.resolved_patch(record)
    use_ray = bool(address or os.environ.get("RAY_ADDRESS")) or (workers or 1) > 1
    if not use_ray:
        predictor = _LocalPredictor(str(model_dir), options, None)
        outcomes = []
        for i, job in enumerate(jobs):
            outcomes.append(predictor.run(job))
            if on_done:
                on_done(outcomes[-1], i + 1, len(jobs))
            _stop_on_disk_failure(outcomes[-1:])
        return outcomes
    outcomes = _predict_on_ray(model_dir, jobs, options, workers, address, cpus_per_worker, gpus_per_worker, on_done)
    _stop_on_disk_failure(outcomes)
    return outcomes


def _stop_on_disk_failure(outcomes: list[CaseOutcome]) -> None:
    """A full (or failing) disk ends the command with one error naming the path, not a failure
    per remaining case: nothing later could be written either."""
    failure = next((o.disk_error for o in outcomes if o.disk_error), None)
    if failure:
        raise OutputError(failure)


def _predict_on_ray(
    model_dir: str | Path,
    jobs: list[CaseJob],
    options: PredictOptions,
    workers: int | None,
    address: str | None,
    cpus_per_worker: float,
    gpus_per_worker: float | None,
    on_done: Callable[[CaseOutcome, int, int], None] | None,
) -> list[CaseOutcome]:
    import ray

    from distmis.raysession import init_ray, shutdown_ray

    started_here = not (address or os.environ.get("RAY_ADDRESS"))
    connected_here = not ray.is_initialized()  # leave a caller's own Ray session alone
    local_cpus = math.ceil(workers * cpus_per_worker) if (started_here and workers) else None
    resources = init_ray(address, num_cpus=local_cpus)
    from ray.util import ActorPool

    gpus = resources.get("GPU", 0.0)
    if gpus_per_worker is None:
        gpus_per_worker = 1.0 if gpus >= 1 else 0.0
    if workers is None:
        capacity = int(gpus // gpus_per_worker) if gpus_per_worker else int(resources.get("CPU", 1) // cpus_per_worker)
        workers = max(1, capacity)
    workers = max(1, min(workers, len(jobs)))
    threads = max(1, int(cpus_per_worker))
    actor_cls = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(_LocalPredictor)
    actors = [actor_cls.remote(str(Path(model_dir).resolve()), options, threads) for _ in range(workers)]
    pool = ActorPool(actors)
    # resolve paths: the actors may run elsewhere on a shared filesystem
    resolved = [CaseJob(j.case_id, j.image.resolve(), j.out.resolve()) for j in jobs]
    by_id: dict[str, CaseOutcome] = {}
    for n, outcome in enumerate(pool.map_unordered(lambda a, job: a.run.remote(job), resolved), start=1):
        by_id[outcome.case_id] = outcome
        if on_done:
            on_done(outcome, n, len(jobs))
    for actor in actors:
        ray.kill(actor)
    if connected_here:
        shutdown_ray()
    return [by_id[j.case_id] for j in jobs]
