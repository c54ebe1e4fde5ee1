"""`rlhfkit label assign`: give tasks of a labelling database to named labellers.

Each task goes to `overlap` of the `labellers`, in turn, so that every labeller gets about
as many tasks (`campaign.Campaign.assign_in_turn`); the task then needs `overlap` votes and
only those labellers are given it. The tasks are those named (`tasks`) or a random `share`
of the tasks given to no one yet; `clear` gives the named tasks (all, if none are named) back
to anyone. Run it before or while `rlhfkit label serve` runs: the server reads the
assignments from the database at each request.

A light command (no torch), as `label serve` and `label export` are.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from rlhfkit.errors import require
from rlhfkit.labelling.campaign import Campaign
from rlhfkit.labelling.store import Store

logger = logging.getLogger(__name__)


@dataclass
class AssignConfig:
    """Give tasks of a labelling database to named labellers, each task to `overlap` of
    them in turn."""

    db: str = "runs/label/labels.db"
    """The labelling database (from `rlhfkit label prepare`)."""
    labellers: list[str] = dataclasses.field(default_factory=list)
    """The names the tasks go to (as they sign in, or as `label serve --labellers` lists)."""
    tasks: list[int] = dataclasses.field(default_factory=list)
    """The ids of the tasks to give; none: a `share` of the tasks given to no one yet."""
    share: float = 1.0
    """Without `tasks`: the share of the tasks given to no one yet that are given now, drawn
    at random with `seed` (1.0: all of them)."""
    overlap: int = 1
    """How many of the `labellers` each task goes to, and so how many votes it needs."""
    seed: int = 0
    """The draw of the `share`."""
    clear: bool = False
    """Give the `tasks` (all tasks, if none are named) back to anyone, with the server's
    `labels_per_task`, instead of assigning them."""

    def __post_init__(self) -> None:
        require(self, "db", bool(self.db), "a database file")
        require(self, "share", 0.0 < self.share <= 1.0, "a share in (0, 1]")
        require(
            self,
            "labellers",
            self.clear or bool(self.labellers),
            "at least one name (or clear: true)",
        )
        require(
            self,
            "overlap",
            self.clear or 1 <= self.overlap <= len(self.labellers),
            f"1 to the {len(self.labellers)} labellers named",
        )


def run_assign(config: AssignConfig) -> dict[str, list[int]]:
    """The `rlhfkit label assign` command; returns each labeller's new tasks."""
    store = Store(config.db)
    try:
        campaign = Campaign(store)
        if config.clear:
            tasks = config.tasks or list(store.tasks())
            campaign.assign(tasks, [], None)
            logger.info("%d tasks given back to anyone", len(tasks))
            return {}
        tasks = config.tasks or campaign.unassigned_share(config.share, config.seed)
        given = campaign.assign_in_turn(tasks, config.labellers, config.overlap)
    finally:
        store.close()
    for name, ids in given.items():
        logger.info("%s: %d tasks", name, len(ids))
    logger.info(
        "%d tasks assigned, each to %d of %d labellers", len(tasks), config.overlap, len(given)
    )
    return given
