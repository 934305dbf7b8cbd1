"""Pi on every rank's GPU (notebooks 02 and 03, workshop Exercises 1 and 2); docs/architecture.md names each
module's part."""
