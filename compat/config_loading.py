"""A DeepSpeed config, loaded exactly as ``deepspeed.initialize`` loads it, before the shim reads ``"mesh"``.

``deepspeed.initialize`` turns a non-dict config into a dict with its own loader
(``deepspeed.runtime.tensor_parallel.init_utils.load_ds_config``): a path is read as HJSON (so
``//`` comments, unquoted keys and trailing commas are fine) with duplicate keys rejected; any
other string is decoded as url-safe base64 holding HJSON. :func:`load_deepspeed_config` calls that
same loader, so the shim accepts and rejects exactly what deepspeed does, with one addition: an
error about a file names the file (deepspeed's HJSON / duplicate-key errors do not).
"""

from __future__ import annotations

import os
from typing import Any, Mapping


class DeepSpeedConfigFileError(ValueError):
    """A config file that deepspeed's loader rejects; the message names the file."""


def load_deepspeed_config(config: Any) -> dict[str, Any]:
    """The config as a dict: a mapping as is (copied), a path / base64 string through deepspeed's loader."""
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, os.PathLike):
        config = os.fspath(config)
    from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config

    is_file = isinstance(config, str) and os.path.exists(config)
    try:
        loaded = load_ds_config(config)
    except ValueError as exc:  # hjson's HjsonDecodeError and the duplicate-key error are ValueErrors
        if not is_file:
            raise
        raise DeepSpeedConfigFileError(f"DeepSpeed config file {config!r} does not load: {exc}") from exc
    if not isinstance(loaded, Mapping):
        where = f"config file {config!r}" if is_file else "the base64 config string"
        raise DeepSpeedConfigFileError(f"{where} holds {type(loaded).__name__}, not an object of config keys")
    return dict(loaded)
