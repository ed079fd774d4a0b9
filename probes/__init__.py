"""Per-layer readout probes and induced weights (see DESIGN.md)."""
