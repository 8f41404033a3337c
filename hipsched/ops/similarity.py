"""similarity ops: validation and work measures (see base.py)."""
