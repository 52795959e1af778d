"""speclane."""
