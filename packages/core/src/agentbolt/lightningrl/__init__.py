"""LightningRL: spans -> transitions -> credit -> advantages (being written)."""
