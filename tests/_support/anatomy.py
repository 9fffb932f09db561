"""A small multi-class segmentation task on real anatomy: grey and white matter of the MNI152 brain.

nilearn's wheel ships the ICBM 2009a MNI152 template (T1, skull-stripped, 1 mm) with its grey-
and white-matter probability maps, so a real-anatomy task can be built here without a download.
Each case is one "subject" made from the template: a random small rotation, scaling and shift,
an optional left-right flip, resampled to ``voxel_mm`` and cropped to ``shape``, with a smooth
intensity bias field, a gamma change and noise. The label of a voxel is the most probable tissue
of the maps at that point (0 background/CSF, 1 grey matter, 2 white matter), so the grey-matter
ribbon is as thin as the resolution makes it: 1-2 voxels at 2 mm, the structure a 3D U-Net finds
hardest. ``voxel_mm`` may differ per axis (thick slices, as in prostate MRI): the template is then
first smoothed along the thick axis by the slice's profile (a Gaussian whose full width at half
maximum is the slice's excess over the in-plane spacing), so a slice averages what it spans instead
of sampling one plane.

Used by the tests (``tests/training``) and by ``benchmarks/search_efficiency.py``; nilearn is a
test-only dependency, so this stays out of the ``distmis`` package.

``--only 2`` keeps one structure as the only foreground label (white matter: a binary task, the
one-label shape of MSD's heart, spleen or hippocampus-as-one-structure); the images are the same.
``--only 3`` is a small structure: the lateral ventricles, which the template has no map of, so
they are derived from it: the voxels whose most probable tissue is CSF, more than 15 mm inside the
brain, in connected parts of at least 1 mL (the two lateral ventricles; sulcal CSF and the thin
third ventricle fall out). They are about 2 % of the brain and 3-4.5 % of a 48 x 56 x 48 crop at
2 mm, dark on T1; their horns are 1-2 voxels thin there, so a label has two large parts (left and
right) and a few pieces of horn.

    python tests/_support/anatomy.py OUT [--cases 20] [--shape 64 | X,Y,Z] [--voxel-mm 2 | X,Y,Z] [--seed 0] [--only 1|2|3]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

LABELS = {0: "background", 1: "grey matter", 2: "white matter"}
#: what ``only`` may keep as the one foreground label; the ventricles are not a class of the multi-class task
VENTRICLES = 3
STRUCTURES = {1: "grey matter", 2: "white matter", VENTRICLES: "lateral ventricles"}
TISSUES = ("t1", "gm", "wm")
VENTRICLE_DEPTH_MM, VENTRICLE_MIN_ML = 15.0, 1.0


def _template() -> dict[str, np.ndarray]:
    """The 1 mm T1 template and tissue maps, as float32 in [0, 1] (their files store 0..255)."""
    import nibabel as nib
    from nilearn import datasets

    base = Path(datasets.__file__).parent / "data"
    out = {}
    for name in TISSUES:
        img = nib.load(str(base / f"mni_icbm152_{name}_tal_nlin_sym_09a_converted.nii.gz"))
        out[name] = np.asarray(img.dataobj, dtype=np.float32) / 255.0
    return out


def _ventricles(template: dict[str, np.ndarray]) -> np.ndarray:
    """A 0/1 float map of the lateral ventricles at 1 mm: deep CSF in parts of at least 1 mL (the
    template ships grey- and white-matter maps only, and the ventricles are what is CSF far from the
    brain's surface)."""
    from scipy import ndimage

    t1, gm, wm = template["t1"], template["gm"], template["wm"]
    brain = t1 > 0.02
    depth = ndimage.distance_transform_edt(ndimage.binary_fill_holes(ndimage.binary_closing(brain, iterations=3)))
    csf = np.clip(1.0 - gm - wm, 0.0, 1.0)
    deep = brain & (csf > gm) & (csf > wm) & (depth > VENTRICLE_DEPTH_MM)
    parts, _ = ndimage.label(deep)
    sizes = np.bincount(parts.ravel())
    keep = np.flatnonzero(sizes >= VENTRICLE_MIN_ML * 1000)
    return np.isin(parts, keep[keep > 0]).astype(np.float32)


def _slice_profile(
    template: dict[str, np.ndarray], voxel_mm: float | tuple[float, float, float]
) -> dict[str, np.ndarray]:
    """The template smoothed along each axis by how much thicker than the finest that axis's voxels
    are (the template's axes are the slices' within the cases' small rotations); unchanged when isotropic."""
    from scipy.ndimage import gaussian_filter

    voxel = np.broadcast_to(np.asarray(voxel_mm, dtype=float), (3,))
    if voxel.max() == voxel.min():
        return template
    sigma = [(v - voxel.min()) / 2.355 for v in voxel]  # full width at half maximum -> sigma, in template mm
    return {name: gaussian_filter(vol, sigma) for name, vol in template.items()}


def _rotation(angles: np.ndarray) -> np.ndarray:
    ax, ay, az = angles
    rx = np.array([[1, 0, 0], [0, math.cos(ax), -math.sin(ax)], [0, math.sin(ax), math.cos(ax)]])
    ry = np.array([[math.cos(ay), 0, math.sin(ay)], [0, 1, 0], [-math.sin(ay), 0, math.cos(ay)]])
    rz = np.array([[math.cos(az), -math.sin(az), 0], [math.sin(az), math.cos(az), 0], [0, 0, 1]])
    return rz @ ry @ rx


def make_case(
    template: dict[str, np.ndarray],
    rng: np.random.Generator,
    *,
    shape: tuple[int, int, int],
    voxel_mm: float | tuple[float, float, float],
) -> tuple[np.ndarray, np.ndarray]:
    """One subject: T1 image (X, Y, Z) float32 and label (X, Y, Z) uint8 in 0..2, or 0..3 where the
    template carries a ``ventricles`` map (``VENTRICLES`` marks them, over the tissue class of the voxel)."""
    from scipy.ndimage import affine_transform, gaussian_filter

    t1 = template["t1"]
    brain = np.argwhere(t1 > 0)
    centre = (brain.min(0) + brain.max(0)) / 2.0
    extent = brain.max(0) - brain.min(0)
    # output voxel -> template voxel (1 mm): rotate and scale about the brain's centre, then shift
    # the crop within the brain (a crop smaller than the brain sees a different part of it)
    voxel = np.broadcast_to(np.asarray(voxel_mm, dtype=float), (3,))
    linear = _rotation(rng.uniform(-0.14, 0.14, 3)) @ np.diag(voxel) / rng.uniform(0.9, 1.1)
    if rng.random() < 0.5:
        linear = linear @ np.diag([-1.0, 1.0, 1.0])  # left-right flip
    room = np.maximum(extent - np.asarray(shape) * voxel, 0) / 2.0
    shift = centre + rng.uniform(-1, 1, 3) * room * 0.8
    offset = shift - linear @ ((np.asarray(shape) - 1) / 2.0)
    warped = {
        name: affine_transform(vol, linear, offset=offset, output_shape=shape, order=1, mode="constant", cval=0.0)
        for name, vol in template.items()
    }
    gm, wm = warped["gm"], warped["wm"]
    rest = np.clip(1.0 - gm - wm, 0.0, 1.0)
    label = np.argmax(np.stack([rest, gm, wm]), axis=0).astype(np.uint8)
    label[warped["t1"] <= 0.02] = 0
    if "ventricles" in warped:
        label[(warped["ventricles"] > 0.5) & (warped["t1"] > 0.02)] = VENTRICLES

    image = np.clip(warped["t1"], 0.0, None)
    inside = image > 0.02
    image = image ** rng.uniform(0.75, 1.33)  # contrast of another scanner
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    bias = np.exp(np.tensordot(rng.normal(0, 0.12, 3), grid, axes=1))  # smooth multiplicative bias field
    image = image * bias * rng.uniform(400, 1200)
    noise = gaussian_filter(rng.normal(0, 1, shape), 0.6)
    image = image + noise * image[inside].mean() * rng.uniform(0.02, 0.06)
    image = np.where(inside, np.clip(image, 1e-3, None), 0.0)
    return image.astype(np.float32), label


def write_mni152_task(
    out: str | Path,
    *,
    cases: int = 20,
    shape: tuple[int, int, int] = (64, 64, 64),
    voxel_mm: float | tuple[float, float, float] = 2.0,
    seed: int = 0,
    only: int | None = None,
) -> Path:
    """Write an MSD-layout dataset (dataset.json, imagesTr, labelsTr) of ``cases`` subjects; with
    ``only`` (a key of ``STRUCTURES``), that structure is the one foreground label (1) and every other
    voxel background. The images do not depend on ``only``."""
    import nibabel as nib

    from distmis.files import atomic_directory, write_json_atomic

    out = Path(out)
    if only is not None and only not in STRUCTURES:
        raise ValueError(f"only: expected one of {sorted(STRUCTURES)} ({', '.join(STRUCTURES.values())}), got {only}")
    template = _template()
    if only == VENTRICLES:
        template["ventricles"] = _ventricles(template)
    template = _slice_profile(template, voxel_mm)
    rng = np.random.default_rng(seed)
    voxel = [float(v) for v in np.broadcast_to(np.asarray(voxel_mm, dtype=float), (3,))]
    affine = np.diag([*voxel, 1.0])
    labels = LABELS if only is None else {0: "background", 1: STRUCTURES[only]}
    with atomic_directory(out, command="synth (mni152 test task)") as tmp:
        (tmp / "imagesTr").mkdir()
        (tmp / "labelsTr").mkdir()
        training = []
        for i in range(cases):
            image, label = make_case(template, rng, shape=shape, voxel_mm=voxel_mm)
            if only is not None:
                label = (label == only).astype(np.uint8)
            cid = f"MNI_{i:03d}"
            nib.save(nib.Nifti1Image(image, affine), tmp / "imagesTr" / f"{cid}.nii.gz")
            nib.save(nib.Nifti1Image(label, affine), tmp / "labelsTr" / f"{cid}.nii.gz")
            training.append({"image": f"./imagesTr/{cid}.nii.gz", "label": f"./labelsTr/{cid}.nii.gz"})
        write_json_atomic(
            tmp / "dataset.json",
            {
                "name": "MNI152_TISSUES",
                "description": f"{', '.join(v for k, v in labels.items() if k)} of the ICBM 2009a MNI152 template, "
                f"{cases} warped subjects at {' x '.join(f'{v:g}' for v in voxel)} mm (seed {seed})",
                "reference": "nilearn's MNI152 template and tissue probability maps",
                "tensorImageSize": "3D",
                "modality": {"0": "T1w"},
                "labels": {str(k): v for k, v in labels.items()},
                "numTraining": cases,
                "numTest": 0,
                "training": training,
                "test": [],
            },
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--cases", type=int, default=20)
    p.add_argument("--shape", default="64", help="one side, or X,Y,Z voxels")
    p.add_argument("--voxel-mm", default="2", help="one spacing, or X,Y,Z mm (thick slices: e.g. 1.5,1.5,7.5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--only",
        type=int,
        choices=sorted(STRUCTURES),
        help="one structure as the only label: 1 grey matter, 2 white matter, 3 lateral ventricles (small)",
    )
    a = p.parse_args()
    sides = [int(v) for v in a.shape.split(",")]
    spacing = [float(v) for v in a.voxel_mm.split(",")]
    if len(sides) not in (1, 3) or len(spacing) not in (1, 3):
        p.error("--shape and --voxel-mm take one value or three (X,Y,Z)")
    shape = (sides * 3)[:3] if len(sides) == 1 else sides
    voxel = (spacing * 3)[:3] if len(spacing) == 1 else spacing
    print(write_mni152_task(a.out, cases=a.cases, shape=tuple(shape), voxel_mm=tuple(voxel), seed=a.seed, only=a.only))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
