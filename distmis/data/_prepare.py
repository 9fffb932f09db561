"""MSD directory -> one chunked, compressed array per case (:mod:`distmis.data._cases`) + ``info.json``.

Cases are read, preprocessed and written in parallel worker processes (nibabel decompression,
resampling and compression are CPU-bound), each holding one case at a time; the parent only
collects their records. Everything is written into a hidden sibling of OUT and renamed at the
end: a failure leaves no half-written OUT, and an interrupted run keeps its finished cases for
``--resume``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distmis.config import PrepareConfig
from distmis.data._cases import write_case
from distmis.data._finished import FinishedCase, done_file, read_finished, samples_file, source_stamp
from distmis.data._msd import (
    MsdCase,
    MsdDataset,
    check_case_headers,
    content_warnings,
    load_case_image,
    load_case_label,
    read_dataset_json,
)
from distmis.data._normalize import ALL_ZSCORE, channel_schemes, ct_statistics, normalize
from distmis.data._pool import case_pool
from distmis.data._record import FORMAT, SPLITS, PreparedInfo, Preprocessing
from distmis.exceptions import DataError
from distmis.files import (
    atomic_file,
    check_output,
    check_replaceable,
    resumable_directory,
    write_text_atomic,
)
from distmis.links import open_nofollow
from distmis.locks import LOCK_FILE
from distmis.schema import RunFile


# --------------------------------------------------------------------------- preprocessing (pure numpy)
def crop_or_pad(volume: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """Centre-crop or zero-pad the first three axes of ``volume`` to ``shape``."""
    out = volume
    for axis, target in enumerate(shape):
        size = out.shape[axis]
        if size > target:
            start = (size - target) // 2
            out = np.take(out, np.arange(start, start + target), axis=axis)
        elif size < target:
            before = (target - size) // 2
            pad = [(0, 0)] * out.ndim
            pad[axis] = (before, target - size - before)
            out = np.pad(out, pad)
    return out


def resample(volume: np.ndarray, shape: tuple[int, int, int], *, order: int) -> np.ndarray:
    """Resize the spatial axes to ``shape``: order 1 (trilinear) for images, 0 for labels."""
    from scipy.ndimage import zoom

    factors = [t / s for t, s in zip(shape, volume.shape[:3], strict=True)] + [1] * (volume.ndim - 3)
    out = zoom(volume, factors, order=order, mode="nearest", grid_mode=True)
    return crop_or_pad(out, shape)  # zoom may be off by one voxel through rounding


def preprocess_image(
    image: np.ndarray, shape: tuple[int, int, int], resize: str, normalisation: list[dict[str, Any]] | None = None
) -> np.ndarray:
    """The exact preprocessing applied to an image (inference redoes its normalisation and resizing)."""
    image = normalize(image, normalisation)
    return resample(image, shape, order=1) if resize == "resample" else crop_or_pad(image, shape)


def preprocess_label(label: np.ndarray, shape: tuple[int, int, int], resize: str, label_mode: str) -> np.ndarray:
    label = resample(label, shape, order=0) if resize == "resample" else crop_or_pad(label, shape)
    if label_mode == "binary":  # multiclass and regions keep the label values (regions are made when read)
        label = (label > 0).astype(np.uint8)
    return label.astype(np.uint8)


# --------------------------------------------------------------------------- per-case worker
#: a finished case: its done-record and its sampled foreground intensities, one array per channel
Finished = tuple[FinishedCase, list[np.ndarray]]


def _prepare_case(
    case: MsdCase,
    modalities: tuple[str, ...],
    labels: dict[int, str],
    shape: tuple[int, int, int],
    resize: str,
    label_mode: str,
    normalisation: list[dict[str, Any]],
    work: Path,
) -> Finished:
    """Read, preprocess and write one case into ``work`` (in a worker process: the parent never
    holds a volume, so prepare's memory is one case per process). Returns its done-record."""
    from distmis.data._inspect import case_stats

    image, affine, _ = load_case_image(case.image, len(modalities))
    assert case.label is not None
    label = load_case_label(case.label, image.shape[:3], labels)
    warnings = content_warnings(case.image, image, case.label, label, modalities)
    stats = case_stats(case.case_id, image, affine, label)  # the dataset fingerprint, from the same read
    prepared_image = preprocess_image(image, shape, resize, normalisation)
    del image
    record = write_case(work, case.case_id, prepared_image, preprocess_label(label, shape, resize, label_mode))
    samples = stats.pop("samples")
    buffer = io.BytesIO()
    np.save(buffer, np.stack(samples) if samples else np.zeros((0, 0), np.float32))
    with atomic_file(samples_file(work, case.case_id)) as tmp, open(tmp, "wb") as fh:
        fh.write(buffer.getvalue())
    done = FinishedCase.model_validate(
        {"record": record, "warnings": warnings, "stats": stats, "source": _source_stamp(case)}
    )
    write_text_atomic(done_file(work, case.case_id), done.model_dump_json(indent=2) + "\n")  # last: the case is whole
    return done, list(samples)


def _source_stamp(case: MsdCase) -> list[tuple[str, int, int, int]]:
    return source_stamp([path for path in (case.image, case.label) if path is not None])


def _finished_case(work: Path, case: MsdCase) -> Finished | None:
    """The done-record and samples of a case an interrupted prepare finished (``--resume``), if its
    files are whole, inside ``work``, and made from the source files as they are now."""
    import stat

    done = read_finished(work, case.case_id)
    if done is None or done.source != _source_stamp(case):
        return None
    files = done.record.files
    own = [(work / f.file, f.bytes) for f in (files.image, files.label, files.foreground)]
    samples = samples_file(work, case.case_id)
    try:
        for path, size in [*own, (samples, None)]:
            st = os.lstat(path)  # only what this prepare wrote: a regular file of one name, never a link
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or (size is not None and st.st_size != size):
                return None
        return done, list(np.load(samples))
    except (OSError, ValueError):
        return None


def _check_regions(regions: dict[str, list[int]] | None, label_mode: str, labels: dict[int, str], where: Path) -> None:
    from distmis.labels import metric_name_clash, paint_order

    if label_mode == "regions" and not regions:
        raise DataError("--label-mode regions needs --regions (e.g. msd_task01, or WT=1,2,3;TC=2,3;ET=3)")
    for name, values in (regions or {}).items():
        undeclared = sorted(set(values) - set(labels))
        if undeclared:
            raise DataError(
                f"regions: {name} uses label values {undeclared}, which {where} does not declare "
                f"(it has {sorted(labels)})"
            )
    # a multi-class model reports its labels and the regions side by side: one name each
    named = [(f"label {v}", n) for v, n in sorted(labels.items()) if v] if label_mode == "multiclass" else []
    clash = metric_name_clash(named + [("region", r) for r in regions or {}])
    if clash:
        raise DataError(f"regions: {clash}; rename the region")
    if label_mode == "regions":
        try:
            paint_order(regions or {})
        except ValueError as exc:
            raise DataError(f"regions: {exc}") from None


def _print_warning(text: str) -> None:
    import sys

    print(f"distmis: warning: {text}", file=sys.stderr, flush=True)


def split_cases(case_ids: list[str], fractions: tuple[float, float, float], seed: int) -> dict[str, list[str]]:
    """Deterministic train/val/test split: same ids, fractions and seed give the same split."""
    ids = sorted(case_ids)
    order = np.random.default_rng(seed).permutation(len(ids))
    n = len(ids)
    n_val = int(round(fractions[1] * n))
    n_test = int(round(fractions[2] * n))
    if fractions[1] > 0 and n_val == 0 and n >= 3:
        n_val = 1
    if fractions[2] > 0 and n_test == 0 and n >= 3:
        n_test = 1
    n_train = n - n_val - n_test
    if n_train < 1:
        raise DataError(f"split {list(fractions)} of {n} cases leaves no training case")
    shuffled = [ids[i] for i in order]
    return {
        "train": sorted(shuffled[:n_train]),
        "val": sorted(shuffled[n_train : n_train + n_val]),
        "test": sorted(shuffled[n_train + n_val :]),
    }


def _check_target_size(shape: tuple[int, ...], channels: int) -> None:
    """A target shape is a claim on memory like a header's: one prepared case (float32, every channel)
    must fit in half of this machine's memory, or a typo (2048,2048,2048) ends in the OOM killer."""
    import math

    from distmis.data._msd import max_volume_bytes

    need, limit = math.prod(int(s) for s in shape) * channels * 4, max_volume_bytes()
    if need > limit:
        raise DataError(
            f"shape {','.join(str(int(s)) for s in shape)}: one prepared case is {need / 2**30:.1f} GiB as float32 "
            f"({channels} channel(s)), more than half of this machine's memory ({limit / 2**30:.1f} GiB); "
            "give a smaller shape"
        )


def _manifest(
    dataset: MsdDataset,
    src: Path,
    shape: tuple[int, int, int],
    resize: str,
    label_mode: str,
    regions: dict[str, list[int]] | None,
    split: tuple[float, float, float],
    seed: int,
    normalisation: list[dict[str, Any]],
) -> dict[str, Any]:
    """``info.json`` before its splits are written."""
    # one class per declared label, whatever their numbering (0, 1, 2, 4 gives 4 classes, not 5)
    num_classes = {"binary": 1, "regions": len(regions or {})}.get(label_mode, len({0, *dataset.labels}))
    return {
        "format": FORMAT,
        "source": {"name": dataset.name, "description": dataset.description, "path": str(src.resolve())},
        "shape": list(shape),
        "channels": dataset.num_modalities,
        "modalities": list(dataset.modalities),
        "labels": {str(k): v for k, v in sorted(dataset.labels.items())},
        "label_mode": label_mode,
        "num_classes": num_classes,
        "regions": regions,
        "image_dtype": "float32",
        "label_dtype": "uint8",
        "cases": {},
        "preprocessing": Preprocessing.model_validate(
            {
                "normalisation": ALL_ZSCORE if all(c["scheme"] == "zscore" for c in normalisation) else "per_channel",
                "channel_normalisation": normalisation,
                "resize": resize,
                "shape": list(shape),
            }
        ).model_dump(mode="json", exclude_none=True),
        "split": {"fractions": list(split), "seed": seed},
        "splits": {},
    }


def channel_normalisation(
    dataset: MsdDataset, train_ids: list[str], by_id: dict[str, MsdCase], override: Any, workers: int
) -> list[dict[str, Any]]:
    """Each channel's normalisation, CT parameters measured on the training cases' foreground."""
    schemes = channel_schemes(dataset.modalities, override)
    spec: list[dict[str, Any]] = [{"scheme": s} for s in schemes]
    ct = [c for c, s in enumerate(schemes) if s == "ct"]
    if ct:
        with case_pool(min(workers, max(1, len(train_ids)))) as pool:
            cases = [by_id[i] for i in train_ids]
            n = len(cases)
            samples = list(pool.map(_foreground_samples, cases, [dataset.num_modalities] * n, [dataset.labels] * n))
        for c in ct:
            spec[c] = ct_statistics(np.concatenate([s[c] for s in samples]), dataset.modalities[c])
    return spec


def _foreground_samples(case: MsdCase, num_modalities: int, labels: dict[int, str]) -> list[np.ndarray]:
    """Sampled intensities of the case's foreground (label > 0) voxels, per channel (a worker's job)."""
    from distmis.data._inspect import case_stats

    image, affine, _ = load_case_image(case.image, num_modalities)
    assert case.label is not None
    label = load_case_label(case.label, image.shape[:3], labels)
    return case_stats(case.case_id, image, affine, label)["samples"]


@dataclass
class _Counter:
    """Cases done of the whole dataset, for the progress bar."""

    total: int
    progress: Callable[[int, int], None] | None
    done: int = 0

    def step(self) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total)


@dataclass(frozen=True)
class _PrepareJob:
    """How every case of one dataset is prepared."""

    modalities: tuple[str, ...]
    labels: dict[int, str]
    shape: tuple[int, int, int]
    resize: str
    label_mode: str
    normalisation: list[dict[str, Any]]

    def case(self, case: MsdCase, work: Path) -> Finished:
        """Read, preprocess and write one case (in a worker process)."""
        return _prepare_case(
            case, self.modalities, self.labels, self.shape, self.resize, self.label_mode, self.normalisation, work
        )


def prepare_dataset(
    src: str | Path,
    out: str | Path,
    options: PrepareConfig | None = None,
    *,
    regions: dict[str, list[int]] | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> PreparedInfo:
    """Preprocess an MSD dataset into ``out`` as ``options`` say and return its record (``info.json``).

    ``options`` is the search file's ``data.prepare`` (or what ``distmis prepare``'s options built):
    one validated object, whatever asked for it; ``None`` is its defaults. ``regions`` is
    ``data.regions``: the regions a ``regions`` label mode trains.

    ``warn`` receives what is suspicious but not wrong (a constant channel, a label without
    foreground); by default it is printed to stderr as ``distmis: warning: ...``.

    ``resume``: finish the cases an interrupted prepare with the same options left undone,
    keeping those it wrote (they sit in a hidden directory beside ``out`` until the end).

    Raises:
        DataError: bad ``dataset.json``, missing/corrupt/inconsistent files (a label not
            aligned with its image included), OUT not writable. Nothing is left at ``out``.
        OutputError: OUT is or lies inside the source, or exists and distmis did not write it
            (or ``overwrite`` was not given).
    """
    src, out = Path(src), Path(out)
    o = options if options is not None else PrepareConfig()
    shape, resize, label_mode, split, seed = o.shape, o.resize, o.label_mode, o.split, o.seed
    dataset = read_dataset_json(src)
    _check_regions(regions, label_mode, dataset.labels, src / "dataset.json")
    _check_target_size(shape, dataset.num_modalities)
    check_output(out, option="OUT", inputs={"source dataset": src})
    check_replaceable(out, option="OUT", overwrite=overwrite)
    for case in dataset.training:  # headers only: every misaligned case is found before any work
        check_case_headers(case, dataset.num_modalities)

    splits = split_cases([c.case_id for c in dataset.training], split, seed)
    by_id = {c.case_id: c for c in dataset.training}
    workers = workers or min(len(dataset.training), os.cpu_count() or 1)
    shape = tuple(int(s) for s in shape)  # type: ignore[assignment]
    normalisation = channel_normalisation(dataset, splits["train"], by_id, o.normalization, workers)
    document = _manifest(dataset, src, shape, resize, label_mode, regions, split, seed, normalisation)
    job = _PrepareJob(dataset.modalities, dataset.labels, shape, resize, label_mode, normalisation)
    recorded = {k: v for k, v in document.items() if k not in ("splits", "cases")}
    try:
        with resumable_directory(out, command="prepare", overwrite=overwrite, resume=resume, job=recorded) as work:
            with open_nofollow(work / LOCK_FILE, "a"):  # what a search reading this dataset holds (reader_lock)
                pass
            done = _prepare_cases(job, work, [c.case_id for c in dataset.training], by_id, workers, progress)
            case_stats = []
            for cid in sorted(done):
                finished, samples = done[cid]
                document["cases"][cid] = finished.record.model_dump()
                case_stats.append(finished.fingerprint_stats(samples))
                for text in finished.warnings:
                    (warn or _print_warning)(text)
            for name in SPLITS:
                document["splits"][name] = {"cases": splits[name], "num_cases": len(splits[name])}
            from distmis.data._inspect import aggregate

            document["fingerprint"] = aggregate(
                case_stats, labels=dataset.labels, modalities=dataset.modalities, name=dataset.name
            )
            # written through its model: a record prepare cannot read back is never written
            info = PreparedInfo.model_validate(document)
            text = info.model_dump_json(indent=2, exclude={"fold"}, exclude_none=True)
            write_text_atomic(work / RunFile.PREPARED_INFO, text + "\n")
            for cid in done:  # what only a resume needed
                done_file(work, cid).unlink(missing_ok=True)
                samples_file(work, cid).unlink(missing_ok=True)
    except PermissionError as exc:
        raise DataError(f"{out}: not writable ({exc})") from None
    return info


def _prepare_cases(
    job: _PrepareJob,
    work: Path,
    ids: list[str],
    by_id: dict[str, MsdCase],
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> dict[str, Finished]:
    """Every case's done-record: those a resumed prepare finished before, and the rest made now."""
    done = {cid: d for cid in ids if (d := _finished_case(work, by_id[cid])) is not None}
    counter = _Counter(len(ids), progress)
    for _ in done:
        counter.step()
    todo = [cid for cid in ids if cid not in done]
    if not todo:
        return done
    with case_pool(min(workers, len(todo))) as pool:
        futures = {cid: pool.submit(job.case, by_id[cid], work) for cid in todo}
        try:
            for cid, fut in futures.items():
                done[cid] = fut.result()
                counter.step()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # one bad case: do not process the rest
            raise
    return done
