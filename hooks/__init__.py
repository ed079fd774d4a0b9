"""Hook-name helpers, residual collection and interventions (see DESIGN.md)."""
