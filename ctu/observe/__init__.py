"""What a run measures and shows: metrics, confidence intervals, the tracker, the report."""
