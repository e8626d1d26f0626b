"""The run's typed configuration and its checks, and the small safe-I/O helpers every layer uses:
atomic files, the one-writer run lock, credentials redacted from URLs."""
