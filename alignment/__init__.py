"""Similarities between layers and learner iterates (see DESIGN.md)."""
