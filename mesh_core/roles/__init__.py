"""DeepSpeed's process-wide roles on the mesh: what migrated DeepSpeed code calls where legacy read
``deepspeed.utils.groups`` (hpZ, AutoTP, node all-to-all, the expert table, the mpu adapters, the
current / default mesh). Their state has one owner, :data:`mesh_core.roles.state.PROCESS_ROLES`.
Import them from the faces: the user names from :mod:`mesh_core`, the runtime's from
:mod:`mesh_core.runtime_hooks`; this package imports nothing on its own."""
