"""The results of runs on real GPUs: the recorded table (`recorded`), the workshop's A100 runs
(`reference`), and the figures that show them beside what runs here (`plot`)."""
