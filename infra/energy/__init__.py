"""Energy and carbon: what a run costs in joules and gCO2e, and when the grid is cleaner.

- :mod:`infra.energy.rapl`, :mod:`infra.energy.nvml`: the hardware counters (I/O);
- :mod:`infra.energy.meter`: snapshots of them, the pure :class:`Accumulator` and
  :class:`Energy` (joules, ``source``: ``rapl``, ``nvml`` or ``estimate``, gCO2e);
- :mod:`infra.energy.signal`: a carbon-intensity forecast read from a file or URL in the
  Carbon Aware SDK's or Electricity Maps' JSON (I/O around a pure parser);
- :mod:`infra.energy.planner`: pure: given a forecast, the work left and a deadline, run now
  or wait until when.

It lives in ``storage`` because both the pipeline and the trainer measure energy and, by the
import rules, the only package of ours they share is ``storage``; it imports nothing of ours.
"""

from infra.energy.meter import WATTS_PER_CORE, Accumulator, Energy, grams, snapshot
from infra.energy.planner import Decision, Segment, decide
from infra.energy.signal import Signal, SignalError, load_signal, parse_signal

__all__ = ["WATTS_PER_CORE", "Accumulator", "Decision", "Energy", "Segment", "Signal",
           "SignalError", "decide", "grams", "load_signal", "parse_signal", "snapshot"]
