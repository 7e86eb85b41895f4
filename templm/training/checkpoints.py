"""Checkpoints with orbax: the train state (sharded arrays) and a JSON record of the data position and seeds.

Orbax writes each step into a temporary folder and renames it when complete, so a run killed mid-save leaves the
previous step as the latest: a half-written checkpoint is never the one restored.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import jax
import orbax.checkpoint as ocp
from absl import logging

from templm.errors import DataError


class Checkpointer:
    """Saves every `save_period` steps (and on demand), keeps the last `keep`, restores the latest."""

    def __init__(self, directory: str, save_period: int = 1000, keep: Optional[int] = 3):
        self.directory = os.path.abspath(directory)
        self.save_period = save_period
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def should_save(self, step: int) -> bool:
        return self.save_period > 0 and step % self.save_period == 0

    def save(self, step: int, state: Any, meta: dict) -> None:
        if step in self.manager.all_steps():
            return
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()
        logging.info("saved checkpoint %d in %s", step, self.directory)

    def restore(self, abstract_state: Any, step: Optional[int] = None) -> Tuple[Any, dict]:
        """The state laid out as `abstract_state` (ShapeDtypeStructs with shardings) and the JSON record."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise DataError("no checkpoint to restore", self.directory)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        except (ValueError, KeyError, OSError) as e:
            raise DataError(f"checkpoint {step} cannot be restored: {e}", self.directory) from None
        return restored["state"], restored["meta"]

    def close(self) -> None:
        self.manager.close()


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) describing a pytree of arrays, for `Checkpointer.restore`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def load_params(directory: str, step: Optional[int] = None) -> Tuple[Any, dict]:
    """Parameters (host numpy arrays) of a templm checkpoint folder, e.g. to initialise an adaptation run."""
    manager = ocp.CheckpointManager(os.path.abspath(directory), item_names=("state", "meta"))
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise DataError("no checkpoint here", directory)
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                                 meta=ocp.args.JsonRestore()))
    except (ValueError, KeyError, OSError, FileNotFoundError) as e:
        raise DataError(f"checkpoint cannot be restored: {e}", directory) from None
    finally:
        manager.close()
    return restored["state"]["params"], restored["meta"]
