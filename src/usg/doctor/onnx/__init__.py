"""Checks on ONNX files: loading and structure (:mod:`.checks`), op semantics that drift
between runtimes (:mod:`.semantics`), and opset/runtime compatibility (:mod:`.runtime_compat`)."""
