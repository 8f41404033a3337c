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
