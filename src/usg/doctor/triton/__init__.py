"""Checks on Triton model repositories: ``config.pbtxt`` parsing (:mod:`.config`), per-model
checks (:mod:`.checks`), config-vs-model cross-checks (:mod:`.crosscheck`) and ensembles
(:mod:`.ensemble`)."""
