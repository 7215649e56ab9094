"""PyTorch-vs-ONNX parity runs: export (:mod:`.export`), the shape sweep (:mod:`.run`) and the
first-divergence bisection (:mod:`.bisection`)."""
