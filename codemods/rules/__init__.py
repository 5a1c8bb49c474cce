"""The migration rules: one module per codemod command (each usable with ``python -m libcst.tool
codemod``), its private helpers in underscore modules beside it. The order they run in is the
engine's (:data:`codemods.CODEMODS`)."""
