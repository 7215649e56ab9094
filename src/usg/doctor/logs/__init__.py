"""Classify engine logs into findings: the signature rules (:mod:`.rules`, :mod:`.rules_engines`
on :mod:`.rule_base`) and the classifier that applies them (:mod:`.classify`)."""
