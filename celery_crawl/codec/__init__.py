"""Layer 1: a request to bytes and back (msgpack, JSON with tagged values, signed pickle),
and the request fingerprint the dedup filters use."""
