"""Rules for DeepSpeed's process-wide expert state, called from ``groups_getters.leave_Call``.

Legacy ``deepspeed.utils.groups`` keeps one name-keyed expert table and one expert tensor-parallel
size per process. The mesh runtime serves both to every mesh (``mesh_core.runtime_hooks.serve_process_experts``,
set by ``compat.install()``), so inside DeepSpeed's package:

- ``groups._get_expert_model_parallel_world_size()`` → ``expert_tensor_parallel_size()`` (mesh_core;
  it needs no mesh and no process group, as legacy's global read: MoE gating may run before
  ``torch.distributed`` is initialised), in any module;
- the name-keyed getters (``NAMED_EXPERT`` / ``NAMED_NO_ARGS``) read ``expert_groups_named(<mesh>, name)``
  etc. in any DeepSpeed module, not only the engine-scoped ones: whichever mesh is current there (an
  engine's, the default, the world mesh) serves the process table first;
- in a function whose ``groups`` *parameter* is ``deepspeed.utils.groups`` for every caller in the
  package (``GROUPS_PARAMETERS``), ``groups.<getter>(...)`` is treated as the module's getter.

The expert builders stay legacy (with their TODOV1): they fill the table these reads are served from.
"""

from __future__ import annotations

from typing import Optional

# module -> functions whose parameter named ``groups`` receives deepspeed.utils.groups from every
# caller in deepspeed 0.19.8: DeepSpeedEngine._configure_checkpointing passes ``groups=groups`` (the
# module) to checkpoint_engine.utils.create_checkpoint_engine -> create_data_parallel_writer_config
# -> create_universal_parallel_info -> _create_expert_parallel_info; nothing else calls them.
GROUPS_PARAMETERS: dict[str, frozenset] = {
    "deepspeed.runtime.model_checkpointing.utils": frozenset({"_create_expert_parallel_info"}),
}


def groups_parameter_function(module: Optional[str], function: Optional[str]) -> bool:
    """``function`` of ``module`` receives deepspeed.utils.groups as its ``groups`` parameter."""
    return bool(module) and function in GROUPS_PARAMETERS.get(module, frozenset())


def named_reads_here(module: Optional[str]) -> bool:
    """The name-keyed expert reads of ``module`` may be served by the current mesh: any DeepSpeed
    module (the runtime serves the process table to every mesh)."""
    return bool(module) and (module == "deepspeed" or module.startswith("deepspeed."))
