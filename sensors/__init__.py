"""Sensors: the landing sensor and the fan-in sensors that refresh country/language products."""
