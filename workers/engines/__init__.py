"""Inference engines behind the InferenceEngine protocol."""
