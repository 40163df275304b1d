"""Fleet simulator: OTLP-JSON metrics and spans of a GPU inference fleet with injected faults, plus ground truth.

`simulate(SimulationConfig(...)) -> GroundTruth` (see `sloscope.simulator.fleet`); `sloscope simulate` on the
command line.
"""

from sloscope.simulator.fleet import GroundTruth, SimulationConfig, simulate

__all__ = ["GroundTruth", "SimulationConfig", "simulate"]
