"""Review: events from numpy scalars, non-string phases and odd tag values validate against the schema,
in the JSONL lines and in Telemetry.events."""
import json

import numpy as np
import pytest

from hipsched.telemetry import Telemetry, schema_path

jsonschema = pytest.importorskip("jsonschema")


def test_numpy_stream_and_non_string_phase_validate(tmp_path):
    v = jsonschema.Draft202012Validator(json.load(open(schema_path())))
    p = tmp_path / "l.jsonl"
    tel = Telemetry(path=str(p), flush_interval=3600)
    with tel.scope(phase=5, x=np.float32(1.5), y=np.int64(2)):
        tel.record("add", "gpu", "cost_model", np.int64(5), "float32", np.int64(20), np.float32(1.5),
                   np.float64("nan"), None, stream=np.int64(3))
    tel.close()
    line = json.loads(p.read_text().splitlines()[0])
    assert line["stream"] == 3
    d = tel.events[0]
    assert d["stream"] == 3 and d["phase"] == "5"
    for rec in (line, json.loads(json.dumps(d))):
        assert not list(v.iter_errors(rec)), rec


def test_record_with_missing_or_nan_duration_keeps_counters_finite(tmp_path):
    import math
    v = jsonschema.Draft202012Validator(json.load(open(schema_path())))
    p = tmp_path / "l.jsonl"
    tel = Telemetry(path=str(p), flush_interval=3600)
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, 5.0, 1.0, None)
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, None, 1.0, None)        # schema: null allowed
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, float("nan"), 1.0, None)
    tel.record("add", "cpu", "cost_model", 4, "float32", 16, float("inf"), 1.0, None)
    tel.close()
    st = tel.stats()
    assert st.cpu_operations == 4 and st.cpu_time_us == 5.0 and math.isfinite(st.cpu_time_us)
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    assert [x["duration_us"] for x in lines] == [5.0, None, None, None]
    for rec in lines + [json.loads(json.dumps(d)) for d in tel.events]:
        assert not list(v.iter_errors(rec)), rec
