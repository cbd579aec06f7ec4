"""The data plane: `cb-probe`, the in-region carrier loop and measurement engine (imported as csbench.probe)."""
