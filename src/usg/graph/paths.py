"""Model paths as graph files write them; the rules live in :mod:`usg.paths` (below ops and graph)."""

from usg.paths import PathResolutionError, cache_dir, resolve_path

__all__ = ["PathResolutionError", "cache_dir", "resolve_path"]
