"""Layer 1: beat-driven job production, capped by the work already waiting in Redis."""
