"""Weight transfer: a model's parameters from one layout to another (RL: actor / trainer → rollout).

This package's face; its modules are private (``_``-prefixed) and may change.

In one job (both meshes in one ``torch.distributed`` world):

- :class:`ParamLayout` — a parameter's full shape, the dim split over mesh dims, its pipeline stage;
- :func:`plan_transfer` / :func:`transfer` — the pieces each destination rank needs, and moving them
  (every rank of both meshes calls :func:`transfer`);
- :func:`transfer_weights` — both sides' layouts read from DeepSpeed engines (ZeRO-0..3, AutoTP);
- :func:`own_box` — the box of a parameter's full tensor one rank holds under a layout;
- :class:`TransferStats` — what a transfer moved.

Between two separately launched jobs (a trainer and a rollout):

- :class:`WeightLink` — one link per job at a shared ``host:port``; ``send()`` on the trainer's
  ranks meets ``receive()`` on the rollout's;
- :class:`SyncStats` — what one sync moved, and how.

See docs/transfer.md.
"""

from ._engines import transfer_weights
from ._in_job import ParamLayout, TransferStats, own_box, plan_transfer, transfer
from ._jobs import SyncStats, WeightLink

__all__ = [
    "ParamLayout",
    "SyncStats",
    "TransferStats",
    "WeightLink",
    "own_box",
    "plan_transfer",
    "transfer",
    "transfer_weights",
]
