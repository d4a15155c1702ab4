"""tools/timeline.py without a GPU: the chrome trace's kernels, the union of their intervals and the overlap
and idle-gap summary, against hand-computed values."""
import json

import pytest

from tools import timeline


def test_union_length_merges_overlaps():
    assert timeline.union_length([]) == 0.0
    assert timeline.union_length([(0, 10), (5, 20), (30, 40)]) == 30.0      # [0, 20] and [30, 40]
    assert timeline.union_length([(0, 10), (2, 3), (10, 12)]) == 12.0       # nested and touching


def test_summary_of_two_streams():
    events = [{"name": "a", "stream": 7, "start": 0.0, "end": 10.0},
              {"name": "b", "stream": 9, "start": 5.0, "end": 20.0},
              {"name": "a", "stream": 7, "start": 30.0, "end": 40.0}]
    s = timeline.summarize(events)
    assert s["span_ms"] == pytest.approx(0.040) and s["busy_ms"] == pytest.approx(0.030)
    assert s["kernel_sum_ms"] == pytest.approx(0.035)                       # > busy: 5 us ran beside each other
    assert s["streams_ms"] == {"7": pytest.approx(0.020), "9": pytest.approx(0.015)}
    assert s["gaps"] == [{"at_us": 20.0, "us": 10.0, "before": "a"}]
    assert s["kernels"]["a"] == {"us": 20.0, "beside_us": 5.0, "count": 2, "stream": 7}
    assert s["kernels"]["b"]["beside_us"] == 5.0


def test_kernel_events_reads_only_kernels(tmp_path):
    trace = {"traceEvents": [
        {"cat": "kernel", "name": "k2", "ts": 20, "dur": 5, "args": {"stream": 7}},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},
        {"cat": "kernel", "name": "k1", "ts": 10, "dur": 2, "args": {"stream": 13}}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert timeline.kernel_events(str(path)) == [{"name": "k1", "stream": 13, "start": 10.0, "end": 12.0},
                                                 {"name": "k2", "stream": 7, "start": 20.0, "end": 25.0}]
