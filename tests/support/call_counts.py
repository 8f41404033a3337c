"""Counting what a test double is asked to do (launches, allocations, copies): each named method of
`obj` is wrapped for the test's duration (monkeypatch undoes it), and the dict returned counts its
calls, so a test can assert that a refused call reached nothing, and reset the counts in place."""


def count_calls(monkeypatch, obj, names):
    counts = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(obj, name)

        def counted(*a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(obj, name, counted)
    return counts
