"""Reference learners as batched iterates (see DESIGN.md)."""
