"""Fleet simulator: OTLP-JSON metrics and spans of a GPU inference fleet with injected faults, plus ground truth.

`simulate(SimulationConfig(...)) -> GroundTruth` (see `sloscope.simulator.fleet`); `sloscope simulate` on the command line.
"""

__all__ = ["GroundTruth", "SimulationConfig", "simulate"]


def __getattr__(name):  # lazy: `sloscope --help` should not pay for numpy
    if name in __all__:
        from sloscope.simulator import fleet

        return getattr(fleet, name)
    raise AttributeError(name)
