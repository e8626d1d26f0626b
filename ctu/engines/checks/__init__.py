"""The checks that an engine samples from the trainer's weights after a sync: the parity probe (parity) and fingerprints of the engine's own tensors (fingerprint)."""
