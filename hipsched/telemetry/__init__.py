"""Telemetry: every scheduling decision as an event, in memory (ring + exact counters) and optionally
in a JSONL log written by a background thread. See docs/guide/telemetry.md."""
from .events import SCHEMA_VERSION, iso_ts, parse_ts, schema_path
from .recorder import ENV_PATH, Telemetry, path_from_env
from .scope import scope
from .summary import BackendExecutionSummary, BackendStats, OpBackendTotals

__all__ = ["Telemetry", "BackendStats", "BackendExecutionSummary", "OpBackendTotals", "scope", "SCHEMA_VERSION",
           "ENV_PATH", "path_from_env", "iso_ts", "parse_ts", "schema_path"]
