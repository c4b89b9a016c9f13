"""Shared infrastructure of every Shardflow command: neither storage nor any one package.

- :mod:`infra.config`: the one configuration mechanism (typed dataclasses -> cyclopts flags,
  ``--config FILE``, ``SHARDFLOW_*`` environment overrides, the ``error:`` convention);
- :mod:`infra.environment`: the few ``SHARDFLOW_*`` variables that are no config field's
  override, registered with their meaning and default;
- :mod:`infra.user_files`: reading files a user names (regular files only, bounded sizes);
- :mod:`infra.process`: how a command's process ends, and what may cross to another process;
- :mod:`infra.energy`: joules and gCO2e of a run, and when the grid is cleaner.

It sits below every other package (``storage``, ``pipeline``, ``loaders`` and ``trainer`` may
import it) and imports nothing of ours, so that shared machinery never has to pose as part of
one concern (docs/design.md, "Packages").
"""
