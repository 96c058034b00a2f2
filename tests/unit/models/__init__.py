"""The sentence encoder (modelroll_models): its vectors, its protocol, and a sidecar in front."""
