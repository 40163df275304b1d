"""Finding and checking probe samples, for the GPU and storage probe tests."""

from sloscope.probes.sample import Sample
from sloscope import catalog


def by(samples, name, **attrs):
    return [s for s in samples if s.name == name and all(s.attributes.get(k) == v for k, v in attrs.items())]


def one(samples, name, **attrs):
    found = by(samples, name, **attrs)
    assert len(found) == 1, (name, attrs, found)
    return found[0]


def assert_catalog_samples(samples):
    """Every sample is named, typed and attributed as the catalog says, and starts no later than it ends."""
    for s in samples:
        assert isinstance(s, Sample)
        sig = catalog.signal(s.name)
        assert set(s.attributes) <= set(sig.attributes), (s.name, s.attributes)
        assert s.kind == ("gauge" if sig.instrument == catalog.Instrument.GAUGE else "counter_delta")
        assert s.start_time_unix_nano <= s.time_unix_nano
