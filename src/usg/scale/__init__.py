"""Scale-out engines: the same graph on Ray Serve (``usg serve --engine ray``).

Nothing here is cluster code of our own: models become Ray Serve deployments, and the
router deployment runs the in-process executor's own planning, pruning and fan-out with
remote backends (:mod:`usg.scale.ray_remote`).
"""
