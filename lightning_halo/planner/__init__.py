"""Capacity planning: per-rank memory, bytes and epoch time before a run (``lightning-halo plan``; the function is
``lightning_halo.plan``, defined in :mod:`lightning_halo.planner.plan`).

Modules: ``options`` (the planner's options and their parsing), ``facts`` (per-rank counts from a
manifest, a partitioned graph or estimates), ``memory`` (each memory term), ``timing``
(compute from kernel rates, α-β communication, overlap per mode), ``calibrate`` and ``step``
(the machine's kernel rates, measured once and stored), ``plan`` (assembling the plan),
``report`` (the table and the recommendation as printed).
"""

from __future__ import annotations
