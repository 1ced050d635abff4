"""Layer 4: what a person runs: the command line, the status screen, the Prometheus
exporter and its HTTP server, the embedded Valkey."""
