"""``speclane replay``: scenarios replayed in virtual time through the real decision code."""
