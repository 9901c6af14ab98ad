"""The cache dir's areas are declared once (artifacts/core/cache_layout.py) and the modules and
tools that use them take their names from there."""

from __future__ import annotations

from cute_aot.aot.tools.aot_cache.facts import gc
from cute_aot.artifacts.bundle import BUNDLE_SUFFIX
from cute_aot.artifacts.core import cache_layout
from cute_aot.runtime import library_store, manifest_memo, overlay


def test_the_layout_spells_the_bundle_suffix_as_the_format_does():
    assert cache_layout.BUNDLE_SUFFIX == BUNDLE_SUFFIX


def test_every_area_has_a_gc_rule_and_one_name():
    names = [area.name for area in cache_layout.AREAS]
    assert len(set(names)) == len(names)
    assert all(area.gc in cache_layout.GC_RULES for area in cache_layout.AREAS)
    assert gc.CACHES == ("build", "libs", "manifests", "overlay", "remote")


def test_writers_take_their_names_from_the_layout():
    assert manifest_memo.FOLDER == cache_layout.MANIFESTS.folder == "manifests"
    assert manifest_memo.MEMO_NAME.fullmatch(f"{'a' * 64}{manifest_memo.SUFFIX}")
    assert library_store.FACTS_SUFFIX == cache_layout.LIBS.marker
    assert overlay.REFUSED_MARK == cache_layout.OVERLAY_REFUSED
    listed = [area.name for area in cache_layout.AREAS if area.label]
    assert listed == ["overlay", "libs", "manifests"]  # aot-cache env's rows, in this order
