"""Intensity normalisation per channel, chosen by modality, as nnU-Net does.

* ``zscore`` (MRI and every modality but CT): per case, over the non-zero voxels (the head; a
  skull-stripped MRI's background is exactly 0 and stays 0). MRI intensities have no absolute
  scale, so each scan is standardised on its own.
* ``ct``: Hounsfield units are absolute, and air (-1000) and water (0) mean the same in every
  scan. A per-case z-score over non-zero voxels treated air as foreground and tissue at exactly
  0 HU as background. CT is clipped to the 0.5-99.5 percentiles of the *foreground* (label > 0)
  voxels of the training cases, then z-scored with their mean and standard deviation: one
  transform for the whole dataset, recorded in ``info.json`` and ``preprocessing.json`` so that
  prediction redoes it exactly.
* ``none``: the values as stored (already normalised data).

``auto`` (the default) picks ``ct`` for a channel whose ``dataset.json`` modality is ``CT`` and
``zscore`` otherwise; ``data.prepare.normalization`` (``distmis prepare --normalization``) names
a scheme for every channel, or one per channel.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from distmis.exceptions import DataError

SCHEMES = ("zscore", "ct", "none")
AUTO = "auto"
#: the record's ``normalisation`` when every channel is z-scored per case over its non-zero voxels
#: (MRI); ``per_channel`` when any channel has another scheme (CT's clip and global statistics)
ALL_ZSCORE = "zscore_nonzero_per_channel"


def is_ct(modality: str) -> bool:
    """Whether a modality's name says CT, as datasets spell it: ``CT``, ``ct``, ``CT scan``,
    ``non-contrast CT``, ``computed tomography`` (a word of the name, any case; not ``octave``)."""
    words = re.split(r"[^a-z0-9]+", str(modality).lower())
    return "ct" in words or "computed tomography" in " ".join(words)


def channel_schemes(modalities: list[str] | tuple[str, ...], override: Any = AUTO) -> list[str]:
    """The scheme of every channel: ``auto`` by modality, one scheme for all, or one per channel.

    Raises:
        DataError: an unknown scheme, or a list of another length than the channels.
    """
    auto = ["ct" if is_ct(m) else "zscore" for m in modalities]
    if override in (None, AUTO):
        return auto
    given = [override] * len(modalities) if isinstance(override, str) else list(override)
    if len(given) != len(modalities):
        raise DataError(
            f"normalization: {len(given)} scheme(s) for {len(modalities)} channel(s) {list(modalities)}; give one "
            "scheme for all or one per channel"
        )
    for scheme in given:
        if scheme not in (*SCHEMES, AUTO):
            raise DataError(f"normalization: unknown scheme {scheme!r}; expected one of {[*SCHEMES, AUTO]}")
    return [a if g == AUTO else g for g, a in zip(given, auto, strict=True)]


def ct_statistics(samples: np.ndarray, channel: str) -> dict[str, Any]:
    """nnU-Net's CT parameters from foreground intensities of the training cases."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.size < 2:
        raise DataError(
            f"normalization: channel {channel} is CT, but the training cases have no foreground voxel to take "
            "its intensity range from; label the training cases or choose --normalization zscore"
        )
    low, high = np.percentile(samples, [0.5, 99.5])
    std = float(samples.std())
    return {
        "scheme": "ct",
        "clip": [float(low), float(high)],
        "mean": float(samples.mean()),
        "std": std if std > 0 else 1.0,
        "voxels": int(samples.size),
    }


def normalize(image: np.ndarray, spec: list[dict[str, Any]] | None) -> np.ndarray:
    """Apply each channel's recorded scheme to ``image`` (X, Y, Z, C); ``None``: per-case z-score for all."""
    if spec is None:
        return zscore_nonzero(image)
    if len(spec) != image.shape[-1]:
        raise DataError(f"the model's normalisation names {len(spec)} channel(s), the image has {image.shape[-1]}")
    out = np.zeros_like(image, dtype=np.float32)
    for c, channel in enumerate(spec):
        scheme = channel.get("scheme")
        values = image[..., c]
        if scheme == "ct":
            low, high = channel["clip"]
            out[..., c] = (np.clip(values, low, high) - channel["mean"]) / max(float(channel["std"]), 1e-8)
        elif scheme == "none":
            out[..., c] = values
        else:
            out[..., c] = zscore_nonzero(values[..., np.newaxis])[..., 0]
    return out


def zscore_nonzero(image: np.ndarray) -> np.ndarray:
    """Per-channel z-score over the non-zero voxels (the brain); the background stays 0."""
    out = np.zeros_like(image, dtype=np.float32)
    for c in range(image.shape[-1]):
        ch = image[..., c]
        mask = ch != 0
        if mask.sum() < 2:
            continue
        vals = ch[mask]
        std = float(vals.std())
        out[..., c] = np.where(mask, (ch - vals.mean()) / (std if std > 0 else 1.0), 0.0)
    return out


def describe(spec: list[dict[str, Any]] | None, modalities: list[str] | tuple[str, ...]) -> list[str]:
    """One line per channel: its modality and what is done to it."""
    if spec is None:
        return [f"{m}: zscore (per case, non-zero voxels)" for m in modalities]
    lines = []
    for m, channel in zip(modalities, spec, strict=True):
        if channel.get("scheme") == "ct":
            low, high = channel["clip"]
            lines.append(
                f"{m}: ct (clip {low:.4g}..{high:.4g}, z-score with mean {channel['mean']:.4g}, std "
                f"{channel['std']:.4g}, from the training cases' foreground)"
            )
        elif channel.get("scheme") == "none":
            lines.append(f"{m}: none (values as stored)")
        else:
            lines.append(f"{m}: zscore (per case, non-zero voxels)")
    return lines


__all__ = [
    "AUTO",
    "ALL_ZSCORE",
    "SCHEMES",
    "channel_schemes",
    "ct_statistics",
    "describe",
    "is_ct",
    "normalize",
    "zscore_nonzero",
]
