"""Audio input: reading WAV files and bringing them to the rate a model expects."""
