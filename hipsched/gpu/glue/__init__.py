"""The kernel launch glue, one module per op family with the names of hipsched/ops/'s (common.py: what
they share). The op specs name each glue function by string, so nothing here is imported up front."""
