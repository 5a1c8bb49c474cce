"""The codemods' private engine: the machinery that runs the rules (``codemods.rules``) over files.

Not an API: ``codemods`` (``migrate_code``, ``Migration``, ``CODEMODS``, the commands) and
``codemods.migrate`` (the CLI) are the faces. The engine imports a rule module only through the
pipeline's list of rules (:mod:`codemods._engine.pipeline`).
"""
