"""Pictures of prepared cases: every channel with the label overlaid (PNG, or GIF over slices)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from distmis.exceptions import DataError


def read_case(prepared: str | Path, split: str, index: int) -> tuple[str, np.ndarray, np.ndarray, list[str]]:
    """Return (case_id, image (X,Y,Z,C), label (X,Y,Z) ints, modality names) of one prepared case."""
    from distmis.data._cases import CaseReader
    from distmis.data._loader import verify_cases
    from distmis.data._record import load_manifest

    manifest = load_manifest(prepared)
    n = manifest.num_cases(split)
    if not 0 <= index < n:
        raise DataError(f"{manifest.root}: split {split!r} has {n} cases, --case {index} is out of range")
    verify_cases(manifest, split)
    wanted = manifest.cases(split)[index]
    image, label = CaseReader(manifest.root, manifest.case_files()).read(wanted)
    return wanted, image, label, list(manifest.info.modalities)


def _draw(fig, axes, image: np.ndarray, label: np.ndarray, names: list[str], z: int) -> None:  # noqa: ANN001
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap([(0, 0, 0, 0), (1, 0.85, 0, 0.5), (1, 0.1, 0.1, 0.5), (0.1, 0.6, 1, 0.5)])
    for c, ax in enumerate(axes[:-1]):
        ax.clear()
        ax.imshow(image[:, :, z, c].T, cmap="gray", origin="lower")
        ax.set_title(names[c] if c < len(names) else f"ch{c}")
        ax.axis("off")
    ax = axes[-1]
    ax.clear()
    ax.imshow(image[:, :, z, 0].T, cmap="gray", origin="lower")
    ax.imshow(np.clip(label[:, :, z], 0, 3).T, cmap=cmap, vmin=0, vmax=3, origin="lower", interpolation="nearest")
    ax.set_title(f"label (z={z})")
    ax.axis("off")


OUTPUT_SUFFIXES = (".png", ".gif")


def render_case(
    prepared: str | Path, out: str | Path, *, split: str = "train", index: int = 0, overwrite: bool = False
) -> Path:
    """Write a PNG (the slice with the most tumour) or an animated GIF (all slices) of a case.

    The file carries distmis' signature (PNG ``Software`` text, GIF comment), so that
    ``--overwrite`` can tell it from a picture the user made.

    Raises:
        OutputError: OUT is not .png/.gif, lies in the prepared directory, or exists (and is
            not a distmis picture, or ``overwrite`` was not given).
        DataError: the case does not exist or the prepared directory is damaged.
    """
    from distmis import __version__
    from distmis.files import atomic_file, check_output, check_replaceable

    out = Path(out)
    if out.suffix.lower() not in OUTPUT_SUFFIXES:
        from distmis.exceptions import OutputError

        raise OutputError(f"--out {out}: expected a .png or .gif file name")
    check_output(out, option="--out", inputs={"prepared dataset": prepared})
    check_replaceable(out, option="--out", overwrite=overwrite)
    case_id, image, label, names = read_case(prepared, split, index)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = image.shape[-1] + 1
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n, 2.9))
    axes = np.atleast_1d(axes)
    fig.suptitle(f"{case_id} ({split})")
    signature = f"distmis visualize {__version__}"
    try:
        with atomic_file(out) as tmp:
            if out.suffix.lower() == ".gif":
                _save_gif(fig, axes, image, label, names, tmp, signature)
            else:
                per_slice = label.reshape(-1, label.shape[2]).sum(0)
                z = int(np.argmax(per_slice)) if per_slice.max() > 0 else image.shape[2] // 2
                _draw(fig, axes, image, label, names, z)
                fig.tight_layout()
                fig.savefig(tmp, dpi=100, format="png", metadata={"Software": signature})
    finally:
        plt.close(fig)
    return out


def _save_gif(
    fig: Any,
    axes: Any,
    image: np.ndarray,
    label: np.ndarray,
    names: list[str],
    path: Path,
    signature: str,
) -> None:
    """All slices as an animated GIF, with ``signature`` as its comment (Pillow writes it)."""
    from PIL import Image

    frames = []
    for z in range(image.shape[2]):
        _draw(fig, axes, image, label, names, z)
        fig.canvas.draw()
        frames.append(
            Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).convert("P", palette=Image.Palette.ADAPTIVE)
        )
    frames[0].save(
        path, format="GIF", save_all=True, append_images=frames[1:], duration=125, loop=0, comment=signature.encode()
    )
