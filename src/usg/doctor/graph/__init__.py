"""Checks on USG graph YAML files: build and contract checks (:mod:`.checks`) and the
pad-safety dry run (:mod:`.pad_safety`)."""
