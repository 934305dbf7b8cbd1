"""Collectives on GPU data (notebooks 00 and 01, workshop Exercise 0); docs/architecture.md names each module's
part."""
