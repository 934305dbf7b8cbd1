"""The results of runs on real GPUs: the recorded table and the workshop's A100 runs (`recorded`),
and the figures that show them beside what runs here (`plot`)."""
