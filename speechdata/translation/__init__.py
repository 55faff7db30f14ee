"""Streaming-translation segments from forced alignments, MetricX QE and filtered pairs."""
