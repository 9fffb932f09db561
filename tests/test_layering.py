"""The code's shape holds: no private import across packages, no upward import, no function over
80 lines, Ray's private code behind one module, the metric, tag and file names each spelt in one module (see ``tests/_support/layering.py``, which prints them all)."""

from __future__ import annotations

from _support import layering


def test_no_private_module_is_imported_from_another_package() -> None:
    files = layering.python_files(layering.PACKAGE, "tests", "benchmarks", "docs", "notebooks")
    assert layering.private_imports(files) == []


def test_no_room_imports_one_on_a_higher_floor() -> None:
    assert layering.upward_imports(layering.python_files(layering.PACKAGE)) == []


def test_no_function_is_too_long_to_read_at_once() -> None:
    assert layering.long_functions(layering.python_files(layering.PACKAGE)) == []


def test_metric_names_are_spelt_in_one_module() -> None:
    assert layering.metric_literals(layering.python_files(layering.PACKAGE)) == []


def test_ray_private_code_is_imported_by_one_module_only() -> None:
    files = layering.python_files(layering.PACKAGE, "tests", "benchmarks", "docs", "notebooks")
    assert layering.ray_private_imports(files) == []


def test_tag_and_file_names_are_spelt_in_one_module() -> None:
    assert layering.schema_literals(layering.python_files(layering.PACKAGE)) == []


def test_every_room_is_on_a_floor() -> None:
    rooms = {p.name.removesuffix(".py") for p in (layering.REPO / layering.PACKAGE).iterdir()}
    rooms = {r for r in rooms if not r.startswith(".") and r not in ("py.typed", "resources")}
    floors = {room for floor in layering.LAYERS for room in floor}
    assert rooms - floors == set(), "add new modules to tests/_support/layering.py LAYERS"
